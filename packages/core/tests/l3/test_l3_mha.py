"""L3 page stores with MHA host pools: round trips, and a miss for every other format.

The page identity (``PageFormat``) of an MHA pool carries its kind, heads,
head dims, layout, dtype, page size and layers (``page_format_fields``): an
MLA pool, or an MHA pool shaped otherwise, gets a miss for its pages, never
their bytes, even where the pages are the same size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sgl_core
from sgl_core.l3 import FilePageStore, page_format, page_keys
from sgl_core.testing import device_rows, fill_device_random, page_indices

PS = 4


def mha_host(
    layout: str = "page_first",
    *,
    head_num: int = 2,
    head_dim: int = 8,
    v_head_dim: int | None = None,
    layer_num: int = 2,
    dtype: torch.dtype = torch.bfloat16,
    seed: int | None = None,
) -> tuple[sgl_core.MHADevicePool, sgl_core.MHAHostPool]:
    backend = sgl_core.TorchBackend()
    dev = backend.create_mha_device_pool(
        size=6 * PS,
        page_size=PS,
        dtype=dtype,
        head_num=head_num,
        head_dim=head_dim,
        layer_num=layer_num,
        v_head_dim=v_head_dim,
    )
    if seed is not None:
        fill_device_random(dev, seed)
    return dev, backend.create_host_pool(dev, layout=layout, host_to_device_ratio=1.0)


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct", "page_head"])
@pytest.mark.parametrize("v_head_dim", [None, 4])
def test_mha_pages_round_trip_through_the_file_store(
    tmp_path: Path, layout: str, v_head_dim: int | None
) -> None:
    dev, host = mha_host(layout, v_head_dim=v_head_dim, seed=1)
    idx = page_indices([1, 2, 3], PS)
    host.backup_from_device_all_layer(dev, page_indices([0, 1, 2], PS), idx, "direct")
    store = FilePageStore(tmp_path / "l3")
    store.register_host_pool(host)
    keys = page_keys(list(range(3 * PS)), PS, namespace="mha")
    assert store.batch_set(keys, page_indices([0, 1, 2], PS)) == [True] * 3

    target_dev, target = mha_host(layout, v_head_dim=v_head_dim)
    store.register_host_pool(target)
    assert store.batch_exists(keys) == 3
    assert store.batch_get(keys, page_indices([3, 5, 4], PS)) == [True] * 3
    for page, start in zip((0, 1, 2), (3, 5, 4), strict=True):
        assert torch.equal(
            target.get_data_page(start * PS).view(torch.uint8),
            host.get_data_page(page * PS).view(torch.uint8),
        )
    loaded = page_indices([1, 2, 3], PS)
    for layer in range(2):
        target.load_to_device_per_layer(
            target_dev, page_indices([3, 5, 4], PS), loaded, layer, "direct"
        )
        assert torch.equal(device_rows(target_dev, layer, loaded), device_rows(dev, layer, idx))


def test_other_formats_get_a_miss_never_the_bytes(tmp_path: Path) -> None:
    _, host = mha_host(seed=2)
    idx = page_indices([0, 1], PS)
    store = FilePageStore(tmp_path / "l3")
    store.register_host_pool(host)
    keys = page_keys(list(range(2 * PS)), PS)
    assert store.batch_set(keys, idx) == [True, True]
    page_bytes = host.get_dummy_flat_data_page().numel() * 2
    backend = sgl_core.TorchBackend()
    # Same page byte size, other meaning: heads x dims swapped, K/V split differently,
    # another layout, other layers; and an MLA pool of exactly as many bytes per page.
    others = [
        mha_host(head_num=4, head_dim=4)[1],
        mha_host(head_num=1, head_dim=16)[1],
        mha_host(head_dim=12, v_head_dim=4)[1],
        mha_host("page_first_direct")[1],
        mha_host(head_dim=4, layer_num=4)[1],
        mha_host(dtype=torch.float16)[1],
    ]
    mla_dev = backend.create_device_pool(
        size=6 * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=24,
        qk_rope_head_dim=8,
        layer_num=2,
    )
    others.append(backend.create_host_pool(mla_dev, layout="page_first", host_to_device_ratio=1.0))
    mine = page_format(host)
    assert dict(mine.fields)["kv_kind"] == '"mha"'
    for other in others:
        assert other.get_dummy_flat_data_page().numel() * 2 == page_bytes
        assert page_format(other) != mine
        before = other.get_data_page(0).clone()
        store.register_host_pool(other)
        assert store.batch_exists(keys) == 0
        assert store.batch_get(keys, idx) == [False, False]
        assert torch.equal(other.get_data_page(0).view(torch.uint8), before.view(torch.uint8))
    store.register_host_pool(mha_host()[1])  # the same format: a hit
    assert store.batch_exists(keys) == 2
