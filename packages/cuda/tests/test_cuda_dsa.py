"""DeepSeek-V3.2 rows on the cuda backend (Triton interpreter on CPU tensors)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import sgl_cuda
from sgl_core import HostLayout
from sgl_core.errors import UnsupportedLayoutError
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_cuda import CudaMLADevicePool, _kv_checks, _movers

PS = 4


def pool(kv_cache_dim: int = 656, **indexer: object) -> CudaMLADevicePool:
    return sgl_cuda.backend.create_device_pool(
        size=3 * PS, page_size=PS, dtype=torch.uint8, kv_lora_rank=512, qk_rope_head_dim=64,
        layer_num=2, device="cpu", kv_cache_dim=kv_cache_dim, **indexer,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_kernel_layouts_reject_rows_that_are_not_whole_words(layout: str) -> None:
    dev = pool(652)  # 652 bytes: not a multiple of 8
    with pytest.raises(UnsupportedLayoutError, match="multiple of 8"):
        sgl_cuda.backend.create_host_pool(dev, layout=layout)
    sgl_cuda.backend.create_host_pool(pool(656), layout=layout)  # 82 words
    # page_first_direct runs only direct: any row width.
    host = sgl_cuda.backend.create_host_pool(dev, layout="page_first_direct")
    fill_device_random(dev, 1)
    idx = page_indices([1], PS)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    dst = pool(652)
    host.load_to_device_per_layer(dst, idx, idx, 1, "direct")
    assert torch.equal(device_rows(dst, 1, idx), device_rows(dev, 1, idx))


def test_indexer_layers_are_separate_allocations() -> None:
    dev = pool(index_head_dim=128, with_index_k_scale=True)
    assert dev.index_k_buffer is not None and dev.index_k_scale_buffer is not None
    ptrs = {t.untyped_storage().data_ptr() for t in dev.index_k_buffer}
    assert len(ptrs) == 2


def test_kernel_io_moves_kv_by_kernel_and_indexer_by_the_direct_engine() -> None:
    src = pool(index_head_dim=128, with_index_k_scale=True)
    fill_device_random(src, 2)
    host = sgl_cuda.backend.create_host_pool(src, layout=HostLayout.LAYER_FIRST)
    idx = page_indices([2, 0], PS)
    with mock.patch.object(_movers, "bind_rows", wraps=_kv_checks.bind_rows) as launch:
        host.backup_from_device_all_layer(src, idx, idx, "kernel")
    assert launch.call_count == 1  # one launch for every KV layer; indexer rows copied apart
    dst = pool(index_head_dim=128, with_index_k_scale=True)
    for layer in range(2):
        host.load_to_device_per_layer(dst, idx, idx, layer, "kernel")
        assert torch.equal(device_rows(dst, layer, idx), device_rows(src, layer, idx))


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
def test_batched_copy_engine_leaves_indexer_pools_to_the_slot_aware_slices(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the opt-in copy engine, a pool with indexer rows on a layer subset never
    reaches its per-layer entry points (they would address slots as layers); every
    load still restores exactly its layer's rows."""
    from sgl_cuda import _copy_engine

    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "batch")
    called: list[str] = []
    for name in ("layer_first", "page_first"):
        monkeypatch.setattr(_copy_engine, name, lambda *a, _n=name, **k: called.append(_n))
    dev = pool(656, index_head_dim=16, indexer_layer_ids=(1,), with_index_k_scale=True)
    host = sgl_cuda.backend.create_host_pool(dev, layout=layout)
    fill_device_random(dev, 3)
    h_idx, d_idx = page_indices([1, 0], PS), page_indices([2, 1], PS)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    dst = pool(656, index_head_dim=16, indexer_layer_ids=(1,), with_index_k_scale=True)
    for layer in range(dev.layer_num):
        host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "direct")
    assert called == []
    for layer in range(dev.layer_num):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(dev, layer, d_idx))
    for slot in range(1):  # model layer 1 keeps slot 0
        assert torch.equal(dst.index_k_buffer[slot][d_idx], dev.index_k_buffer[slot][d_idx])
        assert torch.equal(
            dst.index_k_scale_buffer[slot][d_idx], dev.index_k_scale_buffer[slot][d_idx]
        )
