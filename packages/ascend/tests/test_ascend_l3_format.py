"""L3 page format identity of Ascend pools: the indexer parts are part of a page's format.

Two kv-split pools whose pages have the same objects and sizes but whose
indexer rows mean different things (other model layers, another head split
of one row width) must never read each other's pages from an L3 store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sgl_ascend
from sgl_ascend import AscendMLADevicePool, AscendMLAHostPool
from sgl_core.l3 import FilePageStore, page_format, page_keys
from sgl_core.testing import random_bits

PS = 4
LAYERS = 3


def make_host(
    *,
    layer_ids: tuple[int, ...] = (2, 0),
    index_head_dim: int = 6,
    rank: int = 8,
    rope: int = 4,
    scale: bool = True,
    seed: int = 0,
) -> AscendMLAHostPool:
    dev: AscendMLADevicePool = sgl_ascend.backend.create_device_pool(
        size=5 * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        layer_num=LAYERS,
        index_head_dim=index_head_dim,
        indexer_layer_ids=list(layer_ids),
        with_index_k_scale=scale,
    )
    host = sgl_ascend.backend.create_host_pool(
        dev, layout="page_first_kv_split", io_backend="kernel_ascend"
    )
    gen = torch.Generator().manual_seed(seed)
    for buf in host.buffers:
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))
    return host


def pages(host: AscendMLAHostPool, first: int, count: int) -> list[bytes]:
    return [
        bytes(host.get_data_page((first + i) * PS).view(torch.uint8).numpy().tobytes())
        for i in range(count)
    ]


# (writer, reader): same objects of the same sizes, different meaning
OTHER_FORMATS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "indexer_layers": ({"layer_ids": (2, 0)}, {"layer_ids": (1, 0)}),
    "indexer_rows": (
        {"layer_ids": (2, 0), "index_head_dim": 6, "scale": False},
        {"layer_ids": (0,), "index_head_dim": 12, "scale": False},
    ),
}


def test_equal_pools_share_pages(tmp_path: Path) -> None:
    a, b = make_host(seed=1), make_host(seed=2)
    assert page_format(a) == page_format(b)
    fields = dict(page_format(a).as_dict())
    assert fields["field:indexer_layer_ids"] == [0, 2]  # the pool keeps them sorted
    assert fields["field:index_k_buffer"] == ["torch.bfloat16", 6]
    assert fields["field:index_k_scale_buffer"] == ["torch.float32", 1]
    assert fields["field:flat_page_dtype"] == "torch.uint8"
    keys = page_keys(list(range(2 * PS)), PS, namespace="ascend/")
    store = FilePageStore(tmp_path)
    store.register_host_pool(a)
    assert store.batch_set(keys, torch.arange(0, 2 * PS)) == [True, True]
    store.register_host_pool(b)
    assert store.batch_get(keys, torch.arange(2 * PS, 4 * PS)) == [True, True]
    assert pages(b, 2, 2) == pages(a, 0, 2)


@pytest.mark.parametrize("differs", sorted(OTHER_FORMATS))
def test_other_indexer_is_a_miss(tmp_path: Path, differs: str) -> None:
    writer, reader = OTHER_FORMATS[differs]
    a = make_host(seed=3, **writer)  # type: ignore[arg-type]
    b = make_host(seed=4, **reader)  # type: ignore[arg-type]
    meta = torch.arange(PS)
    assert a.get_page_buffer_meta(meta)[1] == b.get_page_buffer_meta(meta)[1]
    assert page_format(a) != page_format(b)
    keys = page_keys(list(range(2 * PS)), PS, namespace="ascend/")
    store = FilePageStore(tmp_path)
    store.register_host_pool(a)
    assert store.batch_set(keys, torch.arange(0, 2 * PS)) == [True, True]
    store.register_host_pool(b)
    before = pages(b, 0, 5)
    assert store.batch_exists(keys) == 0
    assert store.batch_get(keys, torch.arange(2 * PS, 4 * PS)) == [False, False]
    assert pages(b, 0, 5) == before
    store.register_host_pool(a)
    assert store.batch_get(keys, torch.arange(2 * PS, 4 * PS)) == [True, True]
    assert pages(a, 2, 2) == pages(a, 0, 2)
