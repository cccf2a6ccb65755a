"""SGLang's default HiCache stack, built as its server builds it, on our pools and store.

The server's flags go through SGLang's own ``prepare_server_args`` and are
published with ``RuntimeContext.set_server_args``; ``create_unified_radix_cache``
then runs ``UnifiedRadixCache.init_hicache`` -> ``_PlainKvStrategy`` ->
``build_kv_only_stack``: a ``HybridCacheController`` over a ``HostPoolGroup``
whose KV entry is our host pool (``kv_host_pool_builder`` in place of SGLang's
``build_kv_host_pool``, the one seam a deployment replaces) and the ``dynamic``
storage backend ``SGLangPageStorage`` attached through
``register_mem_host_pool_v2``. Each test drives SGLang's radix cache: insert ->
write-through (device -> host) -> L3 backup -> evict -> match (host hit) ->
load back -> evict host -> prefetch from L3 -> load back, and checks the
bytes against SGLang's own host pool built by SGLang's ``build_kv_host_pool``
from the same server args.

Stand-ins, and why:

* ``cudaHostRegister`` (``pool_host.common._cuda_host_register``) is a no-op
  while SGLang's own reference host pool is built: there is no CUDA driver.
* SGLang's own host pool cannot transfer on CPU (its copies are
  ``sgl_kernel`` CUDA kernels), so the reference bytes are written through the
  per-layer host views those kernels write (``data_refs`` /
  ``k_data_refs`` / ``v_data_refs``), row ``d`` of device layer ``l`` to host
  slot ``h`` for the (h, d) pairs SGLang's controller used on ours.
* No process group: one rank (``tp_group=None``; SGLang skips its
  collectives), stated through ``get_parallel().override``.
* The scheduler's ``tp_worker`` is an object that only records the layer
  counter SGLang registers with it. SGLang's own device-token allocator
  (``PagedTokenToKVPoolAllocator``), ``ReqToTokenPool``, radix tree, controller
  threads, ``L2TransferEngine`` and CPU streams/events are all real.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import _sglang_stack as st
import pytest
import torch

import sgl_core
from sgl_core.integrations.sglang import SGLangHostPool, kv_host_pool_builder
from sgl_core.integrations.sglang_storage import SGLangPageStorage

from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, EvictParams  # isort: skip
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # isort: skip
from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as asm  # isort: skip
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # isort: skip
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool  # isort: skip
from sglang.srt.mem_cache.pool_host import HostPoolGroup  # isort: skip
from sglang.srt.mem_cache.pool_host import common as host_common  # isort: skip
from sglang.srt.mem_cache.radix_cache import RadixKey  # isort: skip
from sglang.srt.runtime_context import get_parallel  # isort: skip


def _reference_host(dev: Any, host_idx: torch.Tensor, dev_idx: torch.Tensor) -> Any:
    """SGLang's own host pool (its build_kv_host_pool, same server args), with these rows."""
    theirs = _ORIGINAL_BUILD(kv_pool=dev, page_size=st.PAGE)
    if isinstance(dev, MLATokenToKVPool):
        pairs = [(theirs.data_refs[layer], dev.kv_buffer[layer]) for layer in range(st.LAYERS)]
    else:
        pairs = [(theirs.k_data_refs[i], dev.k_buffer[i]) for i in range(st.LAYERS)] + [
            (theirs.v_data_refs[i], dev.v_buffer[i]) for i in range(st.LAYERS)
        ]
    for host_view, device_layer in pairs:  # what SGLang's copy kernels write
        host_view[host_idx] = device_layer[dev_idx].view(host_view.dtype)
    return theirs


_ORIGINAL_BUILD = asm.build_kv_host_pool

_KINDS = {"mla": st.mla, "gqa": st.mha(), "gqa_narrow_v": st.mha(v_head_dim=4)}
_CASES = [
    ("torch", "mla", "page_first", "kernel"),
    ("torch", "mla", "layer_first", "direct"),
    ("torch", "gqa", "page_first", "kernel"),
    ("torch", "gqa", "layer_first", "direct"),
    ("torch", "gqa_narrow_v", "page_first", "kernel"),
    ("cuda", "mla", "page_first", "kernel"),
    ("cuda", "gqa", "page_first", "kernel"),
    ("cuda", "gqa", "layer_first", "direct"),
]


@pytest.mark.parametrize(("backend", "kind", "layout", "io"), _CASES)
def test_default_stack_round_trip(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    published: None,
    backend: str,
    kind: str,
    layout: str,
    io: str,
) -> None:
    monkeypatch.setattr(host_common, "_cuda_host_register", lambda *a, **k: None)
    builder = kv_host_pool_builder(sgl_core.get_backend(backend), layout=layout)
    monkeypatch.setattr(asm, "build_kv_host_pool", builder)
    dev = _KINDS[kind]()
    st.fill(dev, seed=7)
    snapshot = [buf.clone() for buf in st.device_buffers(dev)]
    with get_parallel().override(**st.SINGLE_RANK):
        cache, allocator = st.build(dev, st.flags(tmp_path / "l3", layout, io))
        try:
            _round_trip(cache, allocator, dev, snapshot, layout)
        finally:
            cache.shutdown()


def _spy_backups(host: SGLangHostPool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Record the (host, device) index pairs SGLang's controller backs up through ``host``."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    backup = host.backup_from_device_all_layer

    def recording(device_pool: Any, h: torch.Tensor, d: torch.Tensor, io: str) -> None:
        calls.append((h.cpu().clone(), d.cpu().clone()))
        backup(device_pool, h, d, io)

    # SGLang's L2 engine calls the *_physical name (the same method on ours).
    host.backup_from_device_all_layer = recording  # type: ignore[method-assign]
    host.backup_from_device_all_layer_physical = recording  # type: ignore[method-assign]
    return calls


def _zero_rows(dev: Any, rows: torch.Tensor) -> None:
    for buf in st.device_buffers(dev):
        buf[rows] = 0


def _rows_equal(
    dev: Any, snapshot: list[torch.Tensor], now: torch.Tensor, then: torch.Tensor
) -> bool:
    return all(
        torch.equal(buf[now], old[then])
        for buf, old in zip(st.device_buffers(dev), snapshot, strict=True)
    )


def _meta(pool: Any, h: torch.Tensor) -> list[tuple[int, int, int, int]]:
    ptrs, sizes = pool.get_page_buffer_meta(h)
    row = pool.token_stride_size
    component = pool.size * pool.layer_num * row  # MHA: K bytes, then V; MLA: one
    slab = pool.size * row if pool.layout == "layer_first" else component
    out = []
    for ptr, size in zip(ptrs, sizes, strict=True):
        comp, rest = divmod(ptr - pool.kv_buffer.data_ptr(), component)
        layer, offset = divmod(rest, slab)
        out.append((comp, layer, offset, size))
    return out


def _compare_with_sglang(dev: Any, ours: SGLangHostPool, h: torch.Tensor, d: torch.Tensor) -> None:
    theirs = _reference_host(dev, h, d)
    if ours.head_dim != ours.v_head_dim if ours.is_mha else False:
        # SGLang keeps no flat page for narrower V (its L3 path is the zero-copy
        # meta): the K and V slot bytes and the meta's objects are compared.
        for name in ("k_buffer", "v_buffer"):
            mine, their = getattr(ours.pool, name), getattr(theirs, name)
            assert torch.equal(mine[h].view(torch.uint8), their[h].view(torch.uint8))
        a, sa = ours.get_page_buffer_meta(h)
        b, sb = theirs.get_page_buffer_meta(h)
        bases_a = [ours.pool.k_buffer.data_ptr(), ours.pool.v_buffer.data_ptr()]
        bases_b = [theirs.k_buffer.data_ptr(), theirs.v_buffer.data_ptr()]
        assert [x - bases_a[i % 2] for i, x in enumerate(a)] == [
            x - bases_b[i % 2] for i, x in enumerate(b)
        ] and sa == sb
        return
    for p in h[:: st.PAGE].tolist():
        mine = ours.get_data_page(p).view(torch.uint8)
        assert torch.equal(mine, theirs.get_data_page(p).view(torch.uint8))
    if ours.kv_buffer is not None and theirs.kv_buffer is not None:
        # Same objects in the same order: (component, layer, offset in the slab)
        # per pointer; SGLang's pool has one padding page more, so its slabs are longer.
        assert _meta(ours, h) == _meta(theirs, h)
    assert ours.size_per_token == theirs.size_per_token
    assert ours.get_ksize_per_token() == theirs.get_ksize_per_token()
    assert ours.get_page_buffer_element_size() == theirs.get_page_buffer_element_size()


def _round_trip(
    cache: Any, allocator: Any, dev: Any, snapshot: list[torch.Tensor], layout: str
) -> None:
    cc = cache.cache_controller
    assert isinstance(cc, HybridCacheController) and isinstance(cc.mem_pool_host, HostPoolGroup)
    ours = cc.mem_pool_host.anchor_entry.host_pool
    assert isinstance(ours, SGLangHostPool) and ours.layout == layout
    storage = cc.storage_backend
    assert isinstance(storage, SGLangPageStorage) and "kv" in storage._pools
    backups = _spy_backups(ours)

    # insert -> write-through: HybridCacheController.write -> L2TransferEngine -> our pool
    dev_idx = allocator.alloc(len(st.TOKENS))
    cache.insert(InsertParams(key=RadixKey(array("q", st.TOKENS)), value=dev_idx))
    cache.writing_check(write_back=True)
    assert len(backups) == 1 and torch.equal(backups[0][1], dev_idx)
    host_idx = backups[0][0]
    _compare_with_sglang(dev, ours, host_idx, dev_idx)

    # the L3 backup SGLang queued on the write-through ack (batch_exists, batch_set_v1)
    def backed_up() -> bool:
        cache.check_hicache_events()
        return not cache.ongoing_backup

    st.until(backed_up)
    assert storage.store.stats().stored_pages == len(st.TOKENS) // st.PAGE

    # evict the device copy; match finds it on the host; load back (per layer)
    assert cache.evict(EvictParams(num_tokens=len(st.TOKENS))).num_tokens_evicted == len(st.TOKENS)
    _zero_rows(dev, dev_idx)
    m = st.match(cache)
    assert (m.device_prefix_len, m.host_hit_length) == (0, len(st.TOKENS))
    loaded = st.load_back(cache, m.best_match_node)
    assert _rows_equal(dev, snapshot, loaded, dev_idx)

    # evict device and host; SGLang's prefetch finds the pages in L3
    assert cache.evict(EvictParams(num_tokens=len(st.TOKENS))).num_tokens_evicted == len(st.TOKENS)
    _zero_rows(dev, loaded)
    assert cache.evict_host(len(st.TOKENS)) == len(st.TOKENS)
    for name in ("kv_buffer", "k_buffer", "v_buffer"):
        buf = getattr(ours.pool, name, None)
        if buf is not None:
            buf.zero_()  # every host slot is free: the bytes must come from L3
    m = st.match(cache)
    assert (m.device_prefix_len, m.host_hit_length) == (0, 0)
    handle = CacheRequestHandle("r1", 0)
    cache.prefetch_from_storage(handle, m.last_host_node, array("q", st.TOKENS))

    def prefetched() -> bool:
        cache.check_hicache_events()
        return bool(cache.check_prefetch_progress(handle))

    st.until(prefetched)
    assert cache.pop_prefetch_loaded_tokens(handle) == len(st.TOKENS)
    m = st.match(cache)
    assert (m.device_prefix_len, m.host_hit_length) == (0, len(st.TOKENS))
    loaded = st.load_back(cache, m.best_match_node)
    assert _rows_equal(dev, snapshot, loaded, dev_idx)
