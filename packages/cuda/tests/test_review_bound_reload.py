"""Review: a layer whose launches were already bound, replaced in place, then loaded again
with the same index tensors must be written at its new place (never the old storage)."""

from __future__ import annotations

import pytest
import torch

import sgl_cuda
from sgl_core.testing import device_rows, fill_device_random, page_indices

PS = 4


def pool(dtype: torch.dtype, **indexer: object) -> sgl_cuda.CudaMLADevicePool:
    # fp8: the bound launch holds a uint8 *view* of the layer (byte_view), which
    # ``set_`` on the layer does not move; other dtypes bind the layer itself.
    extra = {"kv_cache_dim": 656} if dtype == torch.uint8 else {}
    rank, rope = (512, 64) if dtype == torch.uint8 else (16, 8)
    return sgl_cuda.backend.create_device_pool(
        size=3 * PS, page_size=PS, dtype=dtype, kv_lora_rank=rank, qk_rope_head_dim=rope,
        layer_num=2, device="cpu", **extra, **indexer,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("part", ["kv", "index_k"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float8_e4m3fn])
def test_reload_of_a_bound_layer_after_set_writes_the_new_storage(
    layout: str, part: str, dtype: torch.dtype
) -> None:
    src = pool(dtype, index_head_dim=16, indexer_layer_ids=(1,), with_index_k_scale=True)
    fill_device_random(src, 5)
    host = sgl_cuda.backend.create_host_pool(src, layout=layout)
    h_idx, d_idx = page_indices([2, 0], PS), page_indices([1, 2], PS)
    host.backup_from_device_all_layer(src, h_idx, h_idx, "kernel")
    dst = pool(dtype, index_head_dim=16, indexer_layer_ids=(1,), with_index_k_scale=True)
    for layer in range(2):  # every layer bound
        host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "kernel")
    target = dst.kv_buffer[1] if part == "kv" else dst.index_k_buffer[0]  # type: ignore[index]
    old = target.clone()
    fresh = torch.zeros_like(target)
    target.set_(fresh)
    if hasattr(dst, "sync_data_ptrs"):
        dst.sync_data_ptrs()
    host.load_to_device_per_layer(dst, h_idx, d_idx, 1, "kernel")  # same index tensors
    rows = d_idx.long()
    got, want = fresh[rows].view(torch.uint8), old[rows].view(torch.uint8)  # random bytes: NaNs
    assert torch.equal(got, want), "layer 1's rows did not reach its new storage"
    assert torch.equal(device_rows(dst, 1, d_idx), device_rows(src, 1, h_idx))
