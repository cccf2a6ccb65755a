"""The backend-author interface: capabilities core asks for instead of naming devices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import sgl_core
from sgl_core import backend as api
from sgl_core import errors
from sgl_core.testing import fill_device_random, page_indices
from sgl_core.transfer.copy._copy import copy_batched

CORE = Path(sgl_core.__file__).parent


def pools(
    layout: str, page_size: int = 4
) -> tuple[api.PerLayerMLADevicePool, api.TokenRowHostPool]:
    torch_backend = sgl_core.TorchBackend()
    dev = torch_backend.create_device_pool(
        size=4 * page_size,
        page_size=page_size,
        dtype=torch.bfloat16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        layer_num=3,
    )
    host = torch_backend.create_host_pool(dev, layout=layout)
    assert isinstance(host, api.TokenRowHostPool)
    return dev, host


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_layer_views_are_the_pools_memory(layout: str) -> None:
    dev, host = pools(layout)
    fill_device_random(dev, 3)
    idx = page_indices([0, 2], dev.page_size)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    ((rows, pages),) = host.layer_views(dev, 1)
    assert rows.shape == (dev.size + dev.page_size, dev.kv_cache_dim)
    assert pages.shape == (host.page_num, host.page_size, dev.kv_cache_dim)
    assert rows.data_ptr() == dev.kv_buffer[1].data_ptr()
    for t in idx.tolist():
        assert torch.equal(pages[t // host.page_size, t % host.page_size], rows[t])
    pages[3, 1].fill_(7)  # a view: writes land in the host pool
    assert bool((host.get_data_page(12).view(-1) == 7).any())


def test_layer_views_validate() -> None:
    dev, host = pools("layer_first")
    with pytest.raises(errors.LayerIndexError):
        host.layer_views(dev, 3)
    other, _ = pools("layer_first", page_size=2)
    with pytest.raises(errors.PoolMismatchError):
        host.layer_views(other, 0)
    assert isinstance(host, api.LayerViews)


def test_capabilities_of_the_torch_pools() -> None:
    for layout, whole in (
        ("layer_first", False),
        ("page_first", False),
        ("page_first_direct", True),
    ):
        _, host = pools(layout)
        assert host.moves_whole_pages("direct") is whole
        host.synchronize()  # synchronous transfers: a no-op that exists
        with pytest.raises(errors.UnsupportedLayoutError):
            host.moves_whole_pages("kernel")
    assert not isinstance(sgl_core.TorchBackend(), api.EmulatedWithoutDevice)


# Files that must not name a device family: they ask pools and backends instead.
NEUTRAL = [
    "testing/_helpers.py",
    "testing/_kinds.py",
    "testing/_suite.py",
    "testing/_suite_base.py",
    "testing/_suite_misuse.py",
    "testing/_suite_pools.py",
    "testing/_suite_rows.py",
    "cli/_hicache_plan.py",
    "cli/_hicache.py",
]
FAMILY = re.compile(
    r"ascend|\bnpu\b|sgl_cuda|torch\.cuda|\bk_buffer|\bkv_buffer|backend\.name == .(?!torch)"
)


@pytest.mark.parametrize("name", NEUTRAL)
def test_core_tools_name_no_device_family(name: str) -> None:
    text = (CORE / name).read_text()
    assert not FAMILY.findall(text.lower()), f"{name} names a device family"
    assert FAMILY.search("if backend.name == 'cuda'")  # the pattern is not vacuous


def test_tuning_presets_per_device() -> None:
    cpu = api.tuning_for(torch.device("cpu"))
    cuda = api.tuning_for(torch.device("cuda", 1))
    npu = api.tuning_for(torch.device("meta"))  # unknown type: the CPU preset
    # the CPU preset: the defaults, but per-layer CPU loads gather only below 4 KiB runs
    assert npu == cpu == api.CopyTuning(load_gather_below_run_bytes=4 << 10)
    assert api.CopyTuning().load_gather_below_run_bytes is None  # None: gather_below_run_bytes
    assert cuda.load_gather_below_run_bytes is None
    assert cuda.batched_cross_device and not cpu.batched_cross_device
    assert cuda.by_address_min_block_bytes == api.NEVER
    pool_dev, _ = pools("layer_first")
    host = sgl_core.TorchBackend(tuning=api.CopyTuning(gather_below_run_bytes=0)).create_host_pool(
        pool_dev, layout="layer_first"
    )
    assert host.tuning == api.CopyTuning(gather_below_run_bytes=0)
    assert pools("layer_first")[1].tuning is None  # None: the device pool's preset


def test_batched_cross_device_copy_moves_every_piece() -> None:
    """``copy_batched`` (the cross-device policy) on CPU tensors: contiguous and strided pairs."""
    src = torch.arange(48, dtype=torch.float32).view(4, 3, 4)
    dst = torch.zeros(4, 3, 4)
    strided_src = torch.arange(24, dtype=torch.float32).view(4, 6)[:, ::2]
    strided_dst = torch.zeros(4, 6)[:, 1::2]
    copy_batched([dst, strided_dst], [src, strided_src])
    assert torch.equal(dst, src)
    assert torch.equal(strided_dst, strided_src)
