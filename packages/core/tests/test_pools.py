"""Torch-backend pool behaviour beyond the conformance suite: sizing, devices, pinning."""

from __future__ import annotations

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core import errors
from sgl_core.testing import device_rows, fill_device_random, page_indices


def small_device(page_size: int = 16, pages: int = 4) -> sgl_core.backend.PerLayerMLADevicePool:
    return sgl_core.TorchBackend().create_device_pool(
        size=pages * page_size,
        page_size=page_size,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=2,
    )


def test_device_pool_geometry() -> None:
    dev = small_device()
    assert (dev.size, dev.page_size, dev.layer_num, dev.kv_cache_dim) == (64, 16, 2, 24)
    assert len(dev.kv_buffer) == 2
    assert dev.kv_buffer[0].shape == (80, 1, 24)
    assert dev.kv_buffer[0].data_ptr() != dev.kv_buffer[1].data_ptr()
    with pytest.raises(errors.PoolSizeError):
        small_device(page_size=16, pages=0)
    with pytest.raises(errors.PoolSizeError):
        sgl_core.TorchBackend().create_device_pool(
            size=10,
            page_size=4,
            dtype=torch.bfloat16,
            kv_lora_rank=1,
            qk_rope_head_dim=1,
            layer_num=1,
        )


def test_set_get_mla_kv_buffer_validates() -> None:
    dev = small_device()
    loc = torch.tensor([3, 9])
    nope = torch.randn(2, 1, 16).bfloat16()
    rope = torch.randn(2, 1, 8).bfloat16()
    dev.set_mla_kv_buffer(1, loc, nope, rope)
    got_nope, got_rope = dev.get_mla_kv_buffer(1, loc)
    assert torch.equal(got_nope, nope) and torch.equal(got_rope, rope)
    with pytest.raises(errors.PoolMismatchError, match="cache_k_rope"):
        dev.set_mla_kv_buffer(1, loc, nope, rope[:, :, :4])
    with pytest.raises(errors.IndexOutOfRangeError):
        dev.get_mla_kv_buffer(0, torch.tensor([80]))
    with pytest.raises(errors.LayerIndexError):
        dev.get_mla_kv_buffer(2, loc)


def test_host_sizing_by_ratio_and_gb() -> None:
    dev = small_device()
    host = sgl_core.TorchBackend().create_host_pool(
        dev, layout="layer_first", host_to_device_ratio=2.5
    )
    assert host.size == 160 and host.size % 16 == 0
    per_token = 2 * 24 * 2
    host = sgl_core.TorchBackend().create_host_pool(
        dev, layout="page_first", host_size_gb=per_token * 100 / 1e9
    )
    assert host.size == 96  # 100 tokens rounded down to whole pages
    with pytest.raises(errors.PoolSizeError, match="no whole page"):
        sgl_core.TorchBackend().create_host_pool(dev, layout="page_first", host_to_device_ratio=0.1)
    with pytest.raises(errors.PoolSizeError, match="available"):
        sgl_core.TorchBackend().create_host_pool(dev, layout="page_first", host_size_gb=1e6)


def test_pin_memory_falls_back_without_cuda() -> None:
    dev = small_device()
    host = sgl_core.TorchBackend().create_host_pool(dev, layout="layer_first", pin_memory=True)
    assert host.pin_memory is torch.cuda.is_available()


def test_page_first_direct_rows_and_meta() -> None:
    dev = small_device()
    fill_device_random(dev, 0)
    host = sgl_core.TorchBackend().create_host_pool(dev, layout="page_first_direct")
    assert host.kv_buffer.shape == (8, 2, 16, 1, 24)
    idx = page_indices([2], 16)
    host.backup_from_device_all_layer(dev, page_indices([5], 16), idx, "direct")
    page = host.kv_buffer[5]
    for layer in range(2):
        assert torch.equal(
            page[layer].reshape(16, -1).view(torch.uint8), device_rows(dev, layer, idx)
        )


def test_replaced_layer_is_revalidated() -> None:
    dev = small_device()
    host = sgl_core.TorchBackend().create_host_pool(dev, layout="layer_first")
    idx = page_indices([1], 16)
    host.load_to_device_per_layer(dev, idx, idx, 0, "direct")
    dev.kv_buffer[1] = torch.zeros(80, 1, 24, dtype=torch.float32)
    with pytest.raises(errors.PoolMismatchError, match=r"kv_buffer\[1\]"):
        host.load_to_device_per_layer(dev, idx, idx, 1, "direct")


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_long_runs_of_one_token_pages(layout: str) -> None:
    """Page size 1 with a long contiguous run (>= 96 KB a layer): the slice-copy path."""
    dev = sgl_core.TorchBackend().create_device_pool(
        size=512, page_size=1, dtype=torch.bfloat16, kv_lora_rank=512, qk_rope_head_dim=64,
        layer_num=3,
    )  # fmt: skip
    fill_device_random(dev, 3)
    host = sgl_core.TorchBackend().create_host_pool(dev, layout=layout)
    src = torch.arange(1, 201)
    host_idx = torch.arange(100, 300)
    host.backup_from_device_all_layer(dev, host_idx, src, "direct")
    dst = torch.arange(301, 501)
    for layer in range(3):
        host.load_to_device_per_layer(dev, host_idx, dst, layer, "direct")
        assert torch.equal(device_rows(dev, layer, dst), device_rows(dev, layer, src))
