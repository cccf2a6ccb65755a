"""The SGLang backend's v2 (host pool group) calls, MHA pools and per-rank roots, without sglang.

SGLang's ``HybridCacheController`` drives the same calls in
tests/with_sglang/test_sglang_default_stack.py; here every rule is checked on
its own, including that a rejected call changes no host byte and no stored page.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch
from _l3_helpers import PAGE, filled_host, tokens

import sgl_core
from sgl_core.errors import PoolMismatchError
from sgl_core.integrations.sglang import kv_host_pool_builder, wrap_host_pool
from sgl_core.integrations.sglang_storage import SGLangPageStorage, rank_root_name
from sgl_core.l3 import FilePageStore, PageStoreArgumentError, page_keys

_ONE_RANK = dict(
    is_mla_model=True, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
    attn_cp_size=1, dcp_rank=0, dcp_size=1, logical_page_size=None,
)  # fmt: skip


def _config(**fields: Any) -> Any:
    extra = fields.pop("extra", {})
    return types.SimpleNamespace(model_name="m", extra_config=extra, **{**_ONE_RANK, **fields})


def _t(
    name: str, keys: list[str], idx: torch.Tensor | None = None, policy: str = "all_pages"
) -> Any:
    return types.SimpleNamespace(name=name, keys=keys, host_indices=idx, hit_policy=policy)


def _mha_host(seed: int) -> Any:
    backend = sgl_core.get_backend("torch")
    dev = backend.create_mha_device_pool(
        size=64, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=3,
        device="cpu",
    )  # fmt: skip
    host = backend.create_host_pool(dev, layout="page_first")
    gen = torch.Generator().manual_seed(seed)
    for buf in (host.k_buffer, host.v_buffer):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))
    return host


def _two_pools(tmp_path: Path) -> tuple[SGLangPageStorage, Any, Any, Any, Any]:
    kv, _ = filled_host("page_first", seed=31)
    side = _mha_host(seed=32)
    kv_w, side_w = wrap_host_pool(kv), wrap_host_pool(side, pool_label="indexer")
    backend = SGLangPageStorage(
        _config(),
        store=FilePageStore(str(tmp_path / "kv")),
        pool_stores={"indexer": FilePageStore(str(tmp_path / "side"))},
    )
    backend.register_mem_pool_host(kv_w)
    backend.register_mem_host_pool_v2(kv_w, "kv")
    backend.register_mem_host_pool_v2(side_w, "indexer")
    return backend, kv, side, kv_w, side_w


def _bytes(*hosts: Any) -> list[torch.Tensor]:
    out = []
    for h in hosts:
        for name in ("kv_buffer", "k_buffer", "v_buffer"):
            buf = getattr(h, name, None)
            if isinstance(buf, torch.Tensor):
                out.append(buf.clone())
    return out


def test_v2_set_get_and_hit_policies(tmp_path: Path) -> None:
    backend, kv, side, _, _ = _two_pools(tmp_path)
    keys = page_keys(list(range(3 * PAGE)), PAGE, scheme="sglang")
    assert backend.batch_set_v1(keys, tokens(0, 3)) == [True] * 3
    # the side pool holds pages 0 and 1 only
    done = backend.batch_set_v2([_t("indexer", keys[:2], tokens(0, 2))])
    assert done == {"indexer": [True, True]}
    assert backend.batch_exists_v2(keys).kv_hit_pages == 3
    all_pages = backend.batch_exists_v2(keys, [_t("indexer", keys)])
    assert (all_pages.kv_hit_pages, all_pages.extra_pool_hit_pages) == (2, {"kv": 3, "indexer": 2})
    # trailing: only the last page of the prefix must exist; page 2 is missing, page 1 is there
    trailing = backend.batch_exists_v2(keys, [_t("indexer", keys[-1:], policy="trailing_pages")])
    assert trailing.kv_hit_pages == 2
    # block groups report their own verdict and never gate the KV hit
    blocks = backend.batch_exists_v2(keys, [_t("indexer", keys, policy="block_groups")])
    assert (blocks.kv_hit_pages, blocks.extra_pool_hit_pages["indexer"]) == (3, 2)

    got = backend.batch_get_v2([_t("kv", keys, tokens(4, 3)), _t("indexer", keys, tokens(4, 3))])
    assert got == {"kv": [True] * 3, "indexer": [True, True, False]}
    for i in range(3):
        assert torch.equal(kv.get_data_page((4 + i) * PAGE), kv.get_data_page(i * PAGE))
    for i in range(2):
        assert torch.equal(side.get_data_page((4 + i) * PAGE), side.get_data_page(i * PAGE))
    # the side pool's pages live under their own keys: the KV store never sees them
    assert backend.store.stats().stored_pages == 3


@pytest.mark.parametrize(
    "bad",
    [
        [_t("nope", ["k"], tokens(0, 1))],  # not registered
        [_t("kv", ["a"], tokens(0, 1)), _t("indexer", ["a", "b"], tokens(2, 1))],  # short
        [_t("kv", ["a"], None)],  # no host indices
        [_t("kv", ["a"], tokens(4, 1)), _t("indexer", ["a"], torch.zeros(PAGE, dtype=torch.int64))],
        [_t("kv", ["a"], tokens(4, 1)), _t("indexer", ["a"], tokens(4, 1) + 1)],  # unaligned
        [_t("kv", "a", tokens(0, 1))],  # keys as one str
        "kv",
        None,
    ],
)
def test_v2_rejected_calls_change_nothing(tmp_path: Path, bad: Any) -> None:
    backend, kv, side, _, _ = _two_pools(tmp_path)
    keys = page_keys(list(range(2 * PAGE)), PAGE, scheme="sglang")
    backend.batch_set_v1(keys, tokens(0, 2))
    before, stats = _bytes(kv, side), backend.store.stats().stored_pages
    for call in (backend.batch_get_v2, backend.batch_set_v2):
        with pytest.raises(PageStoreArgumentError):
            call(bad)
        assert all(torch.equal(a, b) for a, b in zip(before, _bytes(kv, side), strict=True))
        assert backend.store.stats().stored_pages == stats
    with pytest.raises(PageStoreArgumentError):
        backend.batch_exists_v2(keys, [_t("nope", keys)])
    with pytest.raises(PageStoreArgumentError):
        backend.batch_exists_v2(keys, [_t("indexer", keys, policy="sometimes")])


def test_v2_registration_rules(tmp_path: Path) -> None:
    backend, _, side, _, side_w = _two_pools(tmp_path)
    backend.register_mem_host_pool_v2(side_w, "indexer")  # the same pool again: a no-op
    with pytest.raises(PageStoreArgumentError):
        backend.register_mem_host_pool_v2(wrap_host_pool(side), "indexer")
    with pytest.raises(PageStoreArgumentError):
        backend.register_mem_host_pool_v2(side, "draft")  # not wrapped
    with pytest.raises(PageStoreArgumentError):
        backend.register_mem_host_pool_v2(side_w, "")
    # an injected store and no store for the pool: refused, not guessed
    with pytest.raises(PageStoreArgumentError):
        backend.register_mem_host_pool_v2(wrap_host_pool(side), "draft")


def test_mha_pool_wraps_with_sglang_sizes() -> None:
    host = _mha_host(seed=3)
    w = wrap_host_pool(host)
    assert w.is_mha and (w.head_num, w.head_dim, w.v_head_dim) == (2, 8, 8)
    assert w.token_stride_size == 2 * 8 * 2 and w.layout_dim == 3 * 32
    assert w.size_per_token == 2 * 3 * 32 and w.get_ksize_per_token() == 3 * 32
    assert w.storage_format_tag is None
    backend = sgl_core.get_backend("torch")
    dev = backend.create_mha_device_pool(
        size=64, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=3,
        device="cpu",
    )  # fmt: skip
    lf = wrap_host_pool(backend.create_host_pool(dev, layout="layer_first"))
    ptrs, sizes = lf.get_page_buffer_meta(tokens(1, 1))
    raw, _ = lf.pool.get_page_buffer_meta(tokens(1, 1))
    # SGLang's order: (K, V) of layer 0, then of layer 1, ...; ours: all K, then all V
    assert ptrs == [raw[0], raw[3], raw[1], raw[4], raw[2], raw[5]] and len(set(sizes)) == 1


def test_builder_refuses_what_it_cannot_mirror() -> None:
    backend = sgl_core.get_backend("torch")
    build = kv_host_pool_builder(backend, layout="page_first")
    dev = types.SimpleNamespace(page_size=PAGE, kv_cache_dim=80)
    with pytest.raises(PoolMismatchError):
        build(kv_pool=dev, page_size=PAGE, mtp_draft_device_pools=(object(),))
    with pytest.raises(PoolMismatchError):
        build(kv_pool=dev, page_size=2 * PAGE)
    with pytest.raises(PoolMismatchError):
        build(kv_pool=dev, page_size=PAGE, override_kv_cache_dim=81)
    with pytest.raises(ValueError):
        kv_host_pool_builder(backend, layout="sideways")


def test_bounded_ranks_share_one_root(tmp_path: Path) -> None:
    """Two ranks of one server on one bounded path: each gets its own directory."""
    extra = {"store": "file", "path": str(tmp_path / "l3"), "capacity_bytes": 1 << 20}
    host, _ = filled_host("page_first", seed=41)
    keys = page_keys(list(range(2 * PAGE)), PAGE, scheme="sglang")
    for mla in (False, True):
        ranks = [_config(is_mla_model=mla, tp_rank=r, tp_size=2, extra=extra) for r in (0, 1)]
        names = {rank_root_name(c) for c in ranks}
        assert len(names) == 2
        backends = [SGLangPageStorage(c) for c in ranks]  # neither raises RootInUse
        for b in backends:
            b.register_mem_pool_host(wrap_host_pool(host))
            assert b.batch_set_v1(keys, tokens(0, 2)) == [True, True]
            assert b.batch_exists(keys) == 2
        for b in backends:
            b.close()
    dirs = sorted(p.name for p in (tmp_path / "l3").iterdir())
    assert dirs == ["tp0of2", "tp1of2"]  # MHA and MLA ranks of one TP rank name one directory
    unbounded = {**extra, "capacity_bytes": None}
    shared = [SGLangPageStorage(_config(tp_rank=r, tp_size=2, extra=unbounded)) for r in (0, 1)]
    assert all(isinstance(b.store, FilePageStore) for b in shared)
