"""SGLang's DeepSeek-V3.2 HiCache stack, built as its server builds it, on our pools and store.

A ``DSATokenToKVPool`` (packed fp8 KV rows plus the paged indexer; layer 1
reuses layer 0's top-k, so it has no index pages) goes through SGLang's own
``prepare_server_args`` and ``create_unified_radix_cache``:
``UnifiedRadixCache.init_hicache`` -> ``_DsaStrategy.build`` ->
``prepare_host_pool_config`` / ``build_host_pool_group`` (KV root from
``build_kv_host_pool``, the ``INDEXER`` entry from the declaration's
``host_pool_builder``) -> ``HybridCacheController`` over that
``HostPoolGroup``, with ``--hicache-storage-backend dynamic`` on
``SGLangPageStorage`` (``register_mem_host_pool_v2`` for both entries).
The two seams a deployment replaces are replaced: ``build_kv_host_pool`` by
``kv_host_pool_builder`` and ``DSAIndexerHostPoolBuilder`` by
``indexer_host_pool_builder``. Each round trip drives SGLang's radix cache:
insert -> write-through (both entries) -> L3 backup (``batch_set_v1`` for
KV, ``batch_set_v2`` for the indexer) -> evict -> host hit -> load back (per
layer, both entries) -> evict host -> prefetch (``batch_exists_v2``,
``batch_get_v1`` + ``batch_get_v2``) -> load back, and compares the host
bytes with SGLang's own ``MLATokenToKVPoolHost`` and ``DSAIndexerPoolHost``
of the same device pool and server args, byte for byte.

Stand-ins, as in test_sglang_default_stack.py: ``cudaHostRegister`` is a
no-op while SGLang's reference host pools are built (no CUDA driver); their
bytes are written the way SGLang's copy kernels write them (KV: row ``d`` of
each layer to host slot ``h``; indexer: device page ``d // 64`` of each
indexer layer to host page ``h // 64``), since those kernels are CUDA-only;
one rank, no process group; the scheduler's ``tp_worker`` only records the
layer counter. SGLang's allocator, radix tree, controller threads,
``L2TransferEngine`` and CPU streams are real.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Any

import _sglang_stack as st
import pytest
import torch

import sgl_core
from sgl_core.errors import PoolMismatchError
from sgl_core.integrations.sglang import (
    SGLangHostPool,
    SGLangIndexerHostPool,
    indexer_host_pool_builder,
    kv_host_pool_builder,
)
from sgl_core.integrations.sglang_storage import SGLangPageStorage
from sgl_core.l3 import PageStoreArgumentError, page_keys

from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, EvictParams  # isort: skip
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # isort: skip
from sglang.srt.mem_cache.hicache_storage import PoolName  # isort: skip
from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as asm  # isort: skip
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # isort: skip
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool  # isort: skip
from sglang.srt.mem_cache.pool_host import HostPoolGroup  # isort: skip
from sglang.srt.mem_cache.pool_host import common as host_common  # isort: skip
from sglang.srt.mem_cache.pool_host import dsa as dsa_host  # isort: skip
from sglang.srt.mem_cache.radix_cache import RadixKey  # isort: skip
from sglang.srt.runtime_context import get_parallel  # isort: skip

PAGE, LAYERS = st.DSA_PAGE, st.DSA_LAYERS
LIVE = st.DSA_LIVE
TOKENS = list(range(1000, 1000 + 2 * PAGE))  # two pages

_ORIGINAL_KV = asm.build_kv_host_pool
_ORIGINAL_DECL = dsa_host.make_dsa_indexer_pool_decl
_dsa, _state = st.dsa, st.dsa_state


def _install(monkeypatch: pytest.MonkeyPatch, backend: str, layout: str) -> None:
    """The two seams a deployment replaces (docs/sglang.md, DeepSeek-V3.2)."""
    monkeypatch.setattr(host_common, "_cuda_host_register", lambda *a, **k: None)
    b = sgl_core.get_backend(backend)
    monkeypatch.setattr(asm, "build_kv_host_pool", kv_host_pool_builder(b, layout=layout))
    monkeypatch.setattr(dsa_host, "DSAIndexerHostPoolBuilder", indexer_host_pool_builder(b))


def _build(tmp_path: Path, dev: DSATokenToKVPool, layout: str, io: str) -> tuple[Any, Any]:
    return st.build(dev, st.flags(tmp_path / "l3", layout, io), page=PAGE, is_dsa=True)


def _entries(cache: Any) -> tuple[Any, SGLangHostPool, SGLangIndexerHostPool]:
    cc = cache.cache_controller
    assert isinstance(cc, HybridCacheController) and isinstance(cc.mem_pool_host, HostPoolGroup)
    group = cc.mem_pool_host
    assert [e.name for e in group.entries] == [PoolName.KV, PoolName.INDEXER]
    kv, ix = group.get_pool(PoolName.KV), group.get_pool(PoolName.INDEXER)
    assert isinstance(kv, SGLangHostPool) and isinstance(ix, SGLangIndexerHostPool)
    assert not hasattr(kv.pool, "indexer_layer_ids")  # the KV entry holds the KV rows only
    storage = cc.storage_backend
    assert isinstance(storage, SGLangPageStorage) and set(storage._pools) == {"kv", "indexer"}
    return cc, kv, ix


def _spy(host: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    backup = host.backup_from_device_all_layer

    def recording(device_pool: Any, h: torch.Tensor, d: torch.Tensor, io: str) -> None:
        calls.append((h.cpu().clone(), d.cpu().clone()))
        backup(device_pool, h, d, io)

    # SGLang's L2 engine calls the *_physical name (the same method on ours).
    host.backup_from_device_all_layer = recording
    host.backup_from_device_all_layer_physical = recording
    return calls


def _pages(idx: torch.Tensor) -> torch.Tensor:
    return idx[::PAGE] // PAGE


def _zero(dev: DSATokenToKVPool, idx: torch.Tensor) -> None:
    for t in dev.kv_buffer:
        t.view(torch.uint8)[idx] = 0
    for layer in LIVE:
        dev.index_k_with_scale_buffer[layer][_pages(idx)] = 0


def _restored(
    dev: DSATokenToKVPool, snap: list[torch.Tensor], now: torch.Tensor, then: torch.Tensor
) -> bool:
    kv = all(
        torch.equal(t.view(torch.uint8)[now], old[then])
        for t, old in zip(dev.kv_buffer, snap, strict=False)
    )
    index = [dev.index_k_with_scale_buffer[layer] for layer in LIVE]
    old_index = [snap[LAYERS + layer] for layer in LIVE]
    keys_and_scales = all(
        torch.equal(t[_pages(now)], old[_pages(then)])
        for t, old in zip(index, old_index, strict=True)
    )
    return kv and keys_and_scales and dev.index_k_with_scale_buffer[1].numel() == 0


def _sglang_pools(dev: DSATokenToKVPool, h: torch.Tensor, d: torch.Tensor) -> tuple[Any, Any]:
    """SGLang's own KV and INDEXER host pools of ``dev``, holding these pages."""
    theirs_kv = _ORIGINAL_KV(kv_pool=dev, page_size=PAGE)
    for layer in range(LAYERS):
        rows = dev.kv_buffer[layer][d].view(theirs_kv.kv_buffer.dtype)
        if theirs_kv.layout == "page_first_direct":  # (pages, layers, page_size, 1, dim)
            theirs_kv.kv_buffer[h // PAGE, layer, h % PAGE] = rows
        else:  # the per-layer views its kernels write
            theirs_kv.data_refs[layer][h] = rows
    theirs_ix = dsa_host.DSAIndexerPoolHost(
        decl=_ORIGINAL_DECL(dev), anchor_host=theirs_kv, pin_memory=False
    )  # no pinned memory without CUDA
    assert tuple(theirs_ix._live_target_layers) == LIVE
    buf = theirs_ix.index_k_with_scale_buffer
    for i, layer in enumerate(LIVE):  # what its page copies write
        rows = dev.index_k_with_scale_buffer[layer][_pages(d)]
        if theirs_ix.layout == "layer_first":
            buf[i, _pages(h)] = rows
        else:
            buf[_pages(h), i, 0] = rows
    return theirs_kv, theirs_ix


def _compare_with_sglang(
    dev: DSATokenToKVPool,
    kv: SGLangHostPool,
    ix: SGLangIndexerHostPool,
    h: torch.Tensor,
    d: torch.Tensor,
) -> None:
    theirs_kv, theirs_ix = _sglang_pools(dev, h, d)
    for name in (
        "layout", "page_size", "layer_num", "dtype", "indexer_dtype", "size_per_token",
        "indexer_page_stride_size", "indexer_layout_dim", "start_layer", "end_layer",
    ):  # fmt: skip
        assert getattr(ix, name) == getattr(theirs_ix, name), name
    assert ix.get_size_per_token() == theirs_ix.get_size_per_token()
    assert ix.get_ksize_per_token() == theirs_ix.get_ksize_per_token()
    ours_buf, their_buf = ix.index_k_with_scale_buffer, theirs_ix.index_k_with_scale_buffer
    page_axis = 1 if ix.layout == "layer_first" else 0
    assert ours_buf.dtype == their_buf.dtype
    assert [n for i, n in enumerate(ours_buf.shape) if i != page_axis] == [
        n for i, n in enumerate(their_buf.shape) if i != page_axis
    ]
    for p in h[::PAGE].tolist():
        assert torch.equal(ix.get_data_page(p), theirs_ix.get_data_page(p))
        mine, theirs = ix.get_data_page(p, flat=False), theirs_ix.get_data_page(p, flat=False)
        assert mine.shape == theirs.shape and torch.equal(mine, theirs)
        assert torch.equal(
            kv.get_data_page(p).view(torch.uint8), theirs_kv.get_data_page(p).view(torch.uint8)
        )
    assert ix.get_dummy_flat_data_page().shape == theirs_ix.get_dummy_flat_data_page().shape
    if ix.layout != "layer_first":  # SGLang has no page meta for layer_first
        ptrs, sizes = ix.get_page_buffer_meta(h)
        their_ptrs, their_sizes = theirs_ix.get_page_buffer_meta(h)
        assert sizes == their_sizes
        assert [x - ours_buf.data_ptr() for x in ptrs] == [
            x - their_buf.data_ptr() for x in their_ptrs
        ]
    assert kv.size_per_token == theirs_kv.size_per_token
    assert kv.get_page_buffer_element_size() == theirs_kv.get_page_buffer_element_size()


_CASES = [
    ("torch", "page_first", "kernel"),
    ("torch", "layer_first", "direct"),
    ("torch", "page_first_direct", "direct"),
    ("cuda", "page_first", "kernel"),
    ("cuda", "layer_first", "kernel"),
    ("cuda", "page_first_direct", "direct"),
]


def _write_through(cache: Any, allocator: Any, kv: Any, ix: Any) -> tuple[torch.Tensor, ...]:
    kv_calls, ix_calls = _spy(kv), _spy(ix)
    dev_idx = allocator.alloc(len(TOKENS))
    cache.insert(InsertParams(key=RadixKey(array("q", TOKENS)), value=dev_idx))
    cache.writing_check(write_back=True)
    assert len(kv_calls) == len(ix_calls) == 1
    (host_idx, kv_dev), (ix_host, ix_dev) = kv_calls[0], ix_calls[0]
    assert torch.equal(kv_dev, dev_idx) and torch.equal(ix_dev, dev_idx)
    assert torch.equal(ix_host, host_idx)  # the INDEXER entry rides on the KV indices
    return dev_idx, host_idx


def _backed_up(cache: Any) -> None:
    def done() -> bool:
        cache.check_hicache_events()
        return not cache.ongoing_backup

    st.until(done)


def _evict_everything(cache: Any, kv: Any, ix: Any) -> None:
    assert cache.evict(EvictParams(num_tokens=len(TOKENS))).num_tokens_evicted == len(TOKENS)
    assert cache.evict_host(len(TOKENS)) == len(TOKENS)
    kv.pool.kv_buffer.zero_()  # every host slot is free: the bytes must come from L3
    ix.pool.kv_buffer.zero_()


def _prefetch(cache: Any) -> int:
    m = st.match(cache, TOKENS)
    assert (m.device_prefix_len, m.host_hit_length) == (0, 0)
    handle = CacheRequestHandle("r1", 0)
    cache.prefetch_from_storage(handle, m.last_host_node, array("q", TOKENS))

    def prefetched() -> bool:
        cache.check_hicache_events()
        return bool(cache.check_prefetch_progress(handle))

    st.until(prefetched)
    loaded: int = cache.pop_prefetch_loaded_tokens(handle)
    return loaded


@pytest.mark.parametrize(("backend", "layout", "io"), _CASES)
def test_dsa_stack_round_trip(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    published: None,
    backend: str,
    layout: str,
    io: str,
) -> None:
    _install(monkeypatch, backend, layout)
    dev = _dsa()
    snap = _state(dev)
    with get_parallel().override(**st.SINGLE_RANK):
        cache, allocator = _build(tmp_path, dev, layout, io)
        try:
            cc, kv, ix = _entries(cache)
            assert ix.layout == kv.layout == layout and ix.indexer_layer_ids == LIVE
            dev_idx, host_idx = _write_through(cache, allocator, kv, ix)
            _compare_with_sglang(dev, kv, ix, host_idx, dev_idx)

            _backed_up(cache)  # batch_set_v1 (KV) and batch_set_v2 (INDEXER)
            stores = {name: store for name, (_, store) in cc.storage_backend._pools.items()}
            assert {n: s.stats().stored_pages for n, s in stores.items()} == {"kv": 2, "indexer": 2}

            # evict the device copy (its KV rows and index pages zeroed); host hit; load back
            assert cache.evict(EvictParams(num_tokens=len(TOKENS))).num_tokens_evicted == len(
                TOKENS
            )
            _zero(dev, dev_idx)
            m = st.match(cache, TOKENS)
            assert (m.device_prefix_len, m.host_hit_length) == (0, len(TOKENS))
            loaded = st.load_back(cache, m.best_match_node, TOKENS)
            assert _restored(dev, snap, loaded, dev_idx)

            # evict device and host; SGLang's prefetch finds both objects of each page in L3
            _zero(dev, loaded)
            _evict_everything(cache, kv, ix)
            assert _prefetch(cache) == len(TOKENS)
            m = st.match(cache, TOKENS)
            assert (m.device_prefix_len, m.host_hit_length) == (0, len(TOKENS))
            loaded = st.load_back(cache, m.best_match_node, TOKENS)
            assert _restored(dev, snap, loaded, dev_idx)
        finally:
            cache.shutdown()


def _damage(storage: SGLangPageStorage, pages: list[int], how: str) -> None:
    """Drop or corrupt the INDEXER objects of ``pages`` (their KV objects stay whole)."""
    store = storage._pools["indexer"][1]
    keys = storage._keys(page_keys(TOKENS, PAGE, scheme="sglang"), "indexer")
    for p in pages:
        path = store._path(keys[p])
        if how == "dropped":
            os.unlink(path)
        else:
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "pages", "hit_pages"),
    [("dropped", [0, 1], 0), ("corrupt", [0, 1], 0), ("corrupt", [1], 1), ("dropped", [1], 1)],
)
def test_a_dsa_page_hits_only_with_its_indexer_object(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    published: None,
    how: str,
    pages: list[int],
    hit_pages: int,
) -> None:
    """KV objects alone (indexer object missing or failing its checksum) are a miss:
    never KV with a stale indexer. A later page's loss keeps the pages before it."""
    _install(monkeypatch, "torch", "page_first")
    dev = _dsa()
    snap = _state(dev)
    with get_parallel().override(**st.SINGLE_RANK):
        cache, allocator = _build(tmp_path, dev, "page_first", "kernel")
        try:
            cc, kv, ix = _entries(cache)
            dev_idx, _ = _write_through(cache, allocator, kv, ix)
            _backed_up(cache)
            _zero(dev, dev_idx)
            _evict_everything(cache, kv, ix)
            _damage(cc.storage_backend, pages, how)
            assert cc.storage_backend.store.stats().stored_pages == 2  # KV objects all there
            before = _state(dev)
            assert _prefetch(cache) == hit_pages * PAGE
            m = st.match(cache, TOKENS)
            assert (m.device_prefix_len, m.host_hit_length) == (0, hit_pages * PAGE)
            if not hit_pages:
                after = _state(dev)  # nothing loaded: the device pool is unchanged
                assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
                return
            loaded = st.load_back(cache, m.best_match_node, TOKENS[: hit_pages * PAGE])
            assert _restored(dev, snap, loaded, dev_idx[: hit_pages * PAGE])
        finally:
            cache.shutdown()


@pytest.mark.parametrize("seams", ["sglang_indexer", "sglang_kv", "neither"])
def test_a_half_installed_dsa_stack_fails_at_startup(
    seams: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, published: None
) -> None:
    """Our KV root with SGLang's own INDEXER pool: our storage refuses it at attach;
    our INDEXER builder on SGLang's KV root: refused when built; SGLang's pools
    throughout: our storage refuses them. Typed, at startup, no page served."""
    monkeypatch.setattr(host_common, "_cuda_host_register", lambda *a, **k: None)
    backend = sgl_core.get_backend("torch")
    if seams == "sglang_indexer":
        monkeypatch.setattr(
            asm, "build_kv_host_pool", kv_host_pool_builder(backend, layout="page_first")
        )
        error, match = PageStoreArgumentError, "indexer_host_pool_builder"
    elif seams == "sglang_kv":
        monkeypatch.setattr(
            dsa_host, "DSAIndexerHostPoolBuilder", indexer_host_pool_builder(backend)
        )
        error, match = PoolMismatchError, "kv_host_pool_builder"
    else:
        error, match = PageStoreArgumentError, "wrap_host_pool"
    dev = _dsa()
    with get_parallel().override(**st.SINGLE_RANK), pytest.raises(error, match=match):
        _build(tmp_path, dev, "page_first", "kernel")
