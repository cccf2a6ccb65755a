"""L3 page format identity of Ascend MHA pools.

An MHA page and an MLA page of the same layout can have the same objects of
the same sizes (K rows of ``head_num * head_dim`` elements are as wide as an
MLA latent row of that rank), and so can MHA pages of another head split.
Their bytes mean different things: a store must answer a miss, never hand
one pool's page to the other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import sgl_ascend
from sgl_core.l3 import FilePageStore, page_format, page_keys
from sgl_core.testing import random_bits

PS = 4
LAYERS = 3


def fill(host: object, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for buf in host.buffers:  # type: ignore[attr-defined]
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))


def mha_host(*, heads: int = 2, dim: int = 8, v_dim: int = 6, seed: int = 0) -> object:
    dev = sgl_ascend.backend.create_mha_device_pool(
        size=5 * PS, page_size=PS, dtype=torch.bfloat16, head_num=heads, head_dim=dim,
        layer_num=LAYERS, v_head_dim=v_dim,
    )  # fmt: skip
    host = sgl_ascend.backend.create_host_pool(
        dev, layout="page_first_kv_split", io_backend="kernel_ascend"
    )
    fill(host, seed)
    return host


def mla_host(*, rank: int = 16, rope: int = 12, seed: int = 0) -> object:
    dev = sgl_ascend.backend.create_device_pool(
        size=5 * PS, page_size=PS, dtype=torch.bfloat16, kv_lora_rank=rank,
        qk_rope_head_dim=rope, layer_num=LAYERS,
    )  # fmt: skip
    host = sgl_ascend.backend.create_host_pool(
        dev, layout="page_first_kv_split", io_backend="kernel_ascend"
    )
    fill(host, seed)
    return host


def pages(host: object, first: int, count: int) -> list[bytes]:
    return [
        bytes(host.get_data_page((first + i) * PS).view(torch.uint8).numpy().tobytes())  # type: ignore[attr-defined]
        for i in range(count)
    ]


def meta_sizes(host: object) -> list[int]:
    sizes: list[int] = host.get_page_buffer_meta(torch.arange(PS))[1]  # type: ignore[attr-defined]
    return sizes


def test_equal_mha_pools_share_pages(tmp_path: Path) -> None:
    a, b = mha_host(seed=1), mha_host(seed=2)
    assert page_format(a) == page_format(b)  # type: ignore[arg-type]
    keys = page_keys(list(range(2 * PS)), PS, namespace="ascend-mha/")
    store = FilePageStore(tmp_path)
    store.register_host_pool(a)  # type: ignore[arg-type]
    assert store.batch_set(keys, torch.arange(0, 2 * PS)) == [True, True]
    store.register_host_pool(b)  # type: ignore[arg-type]
    assert store.batch_get(keys, torch.arange(2 * PS, 4 * PS)) == [True, True]
    assert pages(b, 2, 2) == pages(a, 0, 2)


def _other_heads() -> object:
    return mha_host(heads=4, dim=4, v_dim=3)


# (writer, reader): pages of the same objects and sizes, bytes that mean other things
OTHERS: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
    "mla-of-equal-width": (
        functools.partial(mha_host, seed=3),
        functools.partial(mla_host, seed=4),
    ),
    "mla-writes-mha-reads": (
        functools.partial(mla_host, seed=3),
        functools.partial(mha_host, seed=4),
    ),
    "other-head-split": (functools.partial(mha_host, seed=3), _other_heads),
}


@pytest.mark.parametrize("case", sorted(OTHERS))
def test_other_format_is_a_miss(tmp_path: Path, case: str) -> None:
    make_writer, make_reader = OTHERS[case]
    a, b = make_writer(), make_reader()
    assert meta_sizes(a) == meta_sizes(b)  # the store cannot tell them apart by size
    assert page_format(a) != page_format(b)  # type: ignore[arg-type]
    keys = page_keys(list(range(2 * PS)), PS, namespace="ascend-mha/")
    store = FilePageStore(tmp_path)
    store.register_host_pool(a)  # type: ignore[arg-type]
    assert store.batch_set(keys, torch.arange(0, 2 * PS)) == [True, True]
    store.register_host_pool(b)  # type: ignore[arg-type]
    before = pages(b, 0, 5)
    assert store.batch_exists(keys) == 0
    assert store.batch_get(keys, torch.arange(2 * PS, 4 * PS)) == [False, False]
    assert pages(b, 0, 5) == before
