"""Pages stored by an earlier release stay hits, byte for byte, for every kind.

``fixtures/store_v2/`` is a ``FilePageStore`` root written once by the code of
version two (before the KV-model redesign, issue 23), with this file's
``write_fixture`` (run ``python packages/core/tests/l3/test_l3_stored_fixture.py``
to rewrite it — only when a page format change is intended, and say so). Every
case below backs up device pages of a known byte pattern and stores them under
its own key namespace. A pool built the same way today must see every key
(``batch_exists``), get every page, and load into its device pool exactly the
rows the old code backed up: a refactor that changes a layout's byte order or
a format identity fails here. A pool of another shape must see none of them.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import sgl_core
from sgl_core.l3 import FilePageStore, page_keys

FIXTURE = Path(__file__).parent / "fixtures" / "store_v2"
PS = 4
PAGES = (1, 3)  # device pages backed up and stored (page 0 is the padding page)
HOST_PAGES = (2, 0)  # where the writer put them in its host pool


class Case(NamedTuple):
    name: str
    kind: str  # "mla" | "mha"
    layout: str
    options: dict[str, Any]


CASES = (
    Case("mla-bf16-lf", "mla", "layer_first", {"dtype": torch.bfloat16}),
    Case("mla-bf16-pf", "mla", "page_first", {"dtype": torch.bfloat16}),
    Case("mla-bf16-pfd", "mla", "page_first_direct", {"dtype": torch.bfloat16}),
    Case("mla-e4m3-pf", "mla", "page_first", {"dtype": torch.float8_e4m3fn}),
    Case(
        "dsa-packed-pf",
        "mla",
        "page_first",
        {
            "dtype": torch.uint8,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "kv_cache_dim": 656,
            "index_head_dim": 16,
            "indexer_layer_ids": [1],
            "with_index_k_scale": True,
        },
    ),
    Case("mha-bf16-ph", "mha", "page_head", {"dtype": torch.bfloat16}),
    Case("mha-bf16-lf", "mha", "layer_first", {"dtype": torch.bfloat16}),
    Case("mha-narrow-v-pf", "mha", "page_first", {"dtype": torch.bfloat16, "v_head_dim": 4}),
)


def build(case: Case, **override: Any) -> tuple[Any, Any]:
    backend = sgl_core.get_backend("torch")
    opts = {**case.options, **override}
    if case.kind == "mla":
        mla = {"kv_lora_rank": 32, "qk_rope_head_dim": 8, **opts}
        dev = backend.create_device_pool(size=4 * PS, page_size=PS, layer_num=2, **mla)
    else:
        mha = {"head_num": 2, "head_dim": 8, **opts}
        dev = backend.create_mha_device_pool(size=4 * PS, page_size=PS, layer_num=2, **mha)
    host = backend.create_host_pool(dev, layout=case.layout, host_to_device_ratio=1.0)
    return dev, host


def pattern(shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    """A fixed byte pattern of ``shape`` and ``dtype`` (no RNG: stable across releases)."""
    count = 1
    for n in shape:
        count *= n
    width = torch.empty((), dtype=dtype).element_size()
    byte = (torch.arange(count * width, dtype=torch.int64) * 37 + salt * 101) % 251
    return byte.to(torch.uint8).view(dtype).reshape(shape)


def fill(dev: Any, case: Case) -> None:
    n = dev.size + dev.page_size
    loc = torch.arange(n, dtype=torch.int64)
    for layer in range(dev.layer_num):
        salt = 2 * layer
        if case.kind == "mha":
            k = pattern((n, dev.head_num, dev.head_dim), dev.dtype, salt)
            v = pattern((n, dev.head_num, dev.v_head_dim), dev.dtype, salt + 1)
            dev.set_kv_buffer(layer, loc, k, v)
            continue
        if "kv_cache_dim" in case.options:
            dev.set_kv_rows(layer, loc, pattern((n, dev.kv_cache_dim), dev.dtype, salt))
        else:
            nope = pattern((n, 1, dev.kv_lora_rank), dev.dtype, salt)
            rope = pattern((n, 1, dev.qk_rope_head_dim), dev.dtype, salt + 1)
            dev.set_mla_kv_buffer(layer, loc, nope, rope)
        if dev.indexer_slot(layer) is not None:
            keys = pattern((n, 1, dev.index_head_dim), dev.dtype, salt + 50)
            scale = pattern((n, 1, 1), torch.float32, salt + 51)
            dev.set_index_k_buffer(layer, loc, keys, scale)


def rows(dev: Any, case: Case, layer: int, loc: torch.Tensor) -> torch.Tensor:
    """One layer's rows as bytes (every component, the indexer's included)."""
    if case.kind == "mha":
        parts = list(dev.get_kv_buffer(layer, loc))
    elif "kv_cache_dim" in case.options:
        parts = [dev.get_kv_rows(layer, loc)]
    else:
        parts = list(dev.get_mla_kv_buffer(layer, loc))
    if case.kind == "mla" and dev.indexer_slot(layer) is not None:
        parts += [p for p in dev.get_index_k_buffer(layer, loc) if p is not None]
    n = loc.numel()
    return torch.cat([p.reshape(n, -1).contiguous().view(torch.uint8) for p in parts], dim=1)


def tokens(pages: tuple[int, ...]) -> torch.Tensor:
    return torch.cat([torch.arange(p * PS, (p + 1) * PS, dtype=torch.int64) for p in pages])


def keys_of(case: Case) -> list[str]:
    return page_keys(list(range(len(PAGES) * PS)), PS, namespace=f"fixture/{case.name}/")


def write_fixture(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    store = FilePageStore(root)
    try:
        for case in CASES:
            dev, host = build(case)
            fill(dev, case)
            host.backup_from_device_all_layer(dev, tokens(HOST_PAGES), tokens(PAGES), "direct")
            store.register_host_pool(host)
            assert store.batch_set(keys_of(case), tokens(HOST_PAGES)) == [True] * len(PAGES)
    finally:
        store.close()


@pytest.fixture
def old_store(tmp_path: Path) -> Iterator[FilePageStore]:
    root = tmp_path / "store"
    shutil.copytree(FIXTURE, root)
    store = FilePageStore(root)
    yield store
    store.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_pages_stored_by_version_two_are_hits_with_their_bytes(
    old_store: FilePageStore, case: Case
) -> None:
    source, _ = build(case)
    fill(source, case)
    dev, host = build(case)
    old_store.register_host_pool(host)
    keys = keys_of(case)
    assert old_store.batch_exists(keys) == len(PAGES)
    targets = (1, 3)  # other host pages than the writer's
    assert old_store.batch_get(keys, tokens(targets)) == [True] * len(PAGES)
    dst = tokens((2, 1))  # other device pages than the source's
    for layer in range(dev.layer_num):
        host.load_to_device_per_layer(dev, tokens(targets), dst, layer, "direct")
    for layer in range(dev.layer_num):
        assert torch.equal(rows(dev, case, layer, dst), rows(source, case, layer, tokens(PAGES)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_pool_of_another_shape_misses_the_old_pages(old_store: FilePageStore, case: Case) -> None:
    other: dict[str, Any]
    if case.kind == "mha":
        other = {"head_dim": 16}
    elif "kv_cache_dim" in case.options:
        other = {"with_index_k_scale": False}
    else:
        other = {"qk_rope_head_dim": 16}
    _, host = build(case, **other)
    old_store.register_host_pool(host)
    assert old_store.batch_exists(keys_of(case)) == 0


def test_the_fixture_holds_every_case() -> None:
    data = [p for p in FIXTURE.rglob("*") if p.is_file()]
    assert len(data) >= len(CASES) * len(PAGES)


if __name__ == "__main__":
    write_fixture(FIXTURE)
    sys.stdout.write(f"wrote {FIXTURE}\n")
