"""SGLang's DSATokenToKVPool (DeepSeek-V3.2): our host pools mirror its indexer too.

SGLang keeps the indexer in pages (``index_k_with_scale_buffer[layer]``: per
page ``page_size`` 128-byte fp8 keys, then ``page_size`` float32 scales).
``create_host_pool`` of such a pool mirrors the keys and scales next to the
packed KV rows, so a backup and a per-layer load move both; a layer that reuses
the previous top-k (a 0-page placeholder) has no indexer; a rejected call
moves no byte of either pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.errors import ArgumentTypeError, PoolMismatchError
from sgl_core.integrations.sglang import wrap_host_pool
from sgl_core.l3 import FilePageStore, page_keys

from sglang.srt.mem_cache import index_key_cache  # isort: skip
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool  # isort: skip
from sglang.srt.runtime_context import get_parallel  # isort: skip

PAGE, LAYERS, KEY = 64, 3, 128


def _dsa(seed: int, skip: list[bool] | None = None) -> DSATokenToKVPool:
    with get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0):
        pool = DSATokenToKVPool(
            size=192, page_size=PAGE, kv_lora_rank=512, dtype=torch.float8_e4m3fn,
            qk_rope_head_dim=64, layer_num=LAYERS, device="cpu", index_head_dim=KEY,
            enable_memory_saver=False, kv_cache_dim=656, skip_topk_layers=skip,
        )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for t in pool.kv_buffer + pool.index_k_with_scale_buffer:
        raw = torch.randint(0, 256, (t.nbytes,), dtype=torch.uint8, generator=gen)
        t.view(torch.uint8).view(-1).copy_(raw)
    return pool


def _tokens(pool: DSATokenToKVPool, layer: int, idx: torch.Tensor) -> tuple[Any, Any]:
    """(keys, scales) bytes of tokens ``idx`` of one layer, read from SGLang's pages."""
    buf = pool.index_k_with_scale_buffer[layer]
    pages, off = idx // PAGE, idx % PAGE
    keys = buf[:, : PAGE * KEY].reshape(-1, PAGE, KEY)[pages, off]
    scales = buf[:, PAGE * KEY :].reshape(-1, PAGE, 4)[pages, off]
    return keys, scales


def _snapshot(pool: DSATokenToKVPool) -> list[torch.Tensor]:
    return [t.clone() for t in pool.kv_buffer + pool.index_k_with_scale_buffer]


def _same(pool: DSATokenToKVPool, snap: list[torch.Tensor]) -> bool:
    now = pool.kv_buffer + pool.index_k_with_scale_buffer
    return all(torch.equal(a, b) for a, b in zip(now, snap, strict=True))


def _pairs(backend_name: str) -> list[tuple[str, str, str]]:
    backend = sgl_core.get_backend(backend_name)
    return [(backend_name, lay.value, io.value)
            for lay, ios in backend.supported_pairs.items() for io in sorted(ios)]  # fmt: skip


@pytest.mark.parametrize(("backend_name", "layout", "io"), _pairs("torch") + _pairs("cuda"))
def test_backup_and_load_move_kv_and_indexer(backend_name: str, layout: str, io: str) -> None:
    backend = sgl_core.get_backend(backend_name)
    src, dst = _dsa(0), _dsa(1)
    src_idx = torch.arange(PAGE, 3 * PAGE)  # two whole pages
    host_idx = torch.arange(0, 2 * PAGE)
    dst_idx = torch.cat([torch.arange(2 * PAGE, 3 * PAGE), torch.arange(0, PAGE)])
    host = backend.create_host_pool(src, layout=layout)
    assert host.indexer_layer_ids == tuple(range(LAYERS))
    host.backup_from_device_all_layer(src, host_idx, src_idx, io)
    untouched = torch.arange(PAGE, 2 * PAGE)
    before = [_tokens(dst, layer, untouched) for layer in range(LAYERS)]
    for layer in range(LAYERS):
        host.load_to_device_per_layer(dst, host_idx, dst_idx, layer, io)
    for layer in range(LAYERS):
        assert torch.equal(src.kv_buffer[layer][src_idx], dst.kv_buffer[layer][dst_idx])
        for a, b in zip(_tokens(src, layer, src_idx), _tokens(dst, layer, dst_idx), strict=True):
            assert torch.equal(a, b), (layout, layer)
        for a, b in zip(before[layer], _tokens(dst, layer, untouched), strict=True):
            assert torch.equal(a, b)  # tokens not loaded keep their bytes


def test_a_skip_topk_layer_has_no_indexer_and_its_load_moves_kv_only() -> None:
    skip = [False, True, False]
    src, dst = _dsa(2, skip), _dsa(3, skip)
    assert src.index_k_with_scale_buffer[1].shape[0] == 0
    host = sgl_core.get_backend("torch").create_host_pool(src, layout="page_first")
    assert host.indexer_layer_ids == (0, 2)
    idx = torch.arange(0, PAGE)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    snap = _snapshot(dst)
    host.load_to_device_per_layer(dst, idx, idx, 1, "direct")
    assert torch.equal(dst.kv_buffer[1][idx], src.kv_buffer[1][idx])
    for layer in (0, 2):  # not loaded yet: nothing of layers 0 and 2 moved
        assert torch.equal(dst.kv_buffer[layer], snap[layer])
        assert torch.equal(dst.index_k_with_scale_buffer[layer], snap[LAYERS + layer])
    host.load_to_device_per_layer(dst, idx, idx, 2, "direct")
    for a, b in zip(_tokens(src, 2, idx), _tokens(dst, 2, idx), strict=True):
        assert torch.equal(a, b)


def test_an_l3_page_carries_the_indexer(tmp_path: Path) -> None:
    backend = sgl_core.get_backend("torch")
    src, dst = _dsa(4), _dsa(5)
    idx = torch.arange(0, 2 * PAGE)
    writer = backend.create_host_pool(src, layout="page_first_direct")
    writer.backup_from_device_all_layer(src, idx, idx, "direct")
    store = FilePageStore(tmp_path)
    store.register_host_pool(writer)
    keys = page_keys(list(range(2 * PAGE)), PAGE)
    assert store.batch_set(keys, idx) == [True, True]
    reader = backend.create_host_pool(dst, layout="page_first_direct")
    store.register_host_pool(reader)
    assert store.batch_get(keys, idx) == [True, True]
    for layer in range(LAYERS):
        reader.load_to_device_per_layer(dst, idx, idx, layer, "direct")
        for a, b in zip(_tokens(src, layer, idx), _tokens(dst, layer, idx), strict=True):
            assert torch.equal(a, b)


def _mla() -> MLATokenToKVPool:
    """The same packed 656-byte KV rows, without an indexer."""
    pool = MLATokenToKVPool(
        size=192, page_size=PAGE, dtype=torch.float8_e4m3fn, kv_lora_rank=512,
        qk_rope_head_dim=64, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
        use_dsa=True, override_kv_cache_dim=656,
    )  # fmt: skip
    assert pool.kv_cache_dim == 656
    return pool


def _host_bytes(host: Any) -> list[torch.Tensor]:
    return [host.get_data_page(i).clone() for i in range(0, host.size, PAGE)]


BAD = ["kpool", "block", "preshuffle", "skip", "dtype", "short", "width", "dim", "stride"]


@pytest.mark.parametrize("bad", [*BAD, "resized", "no_indexer"])
def test_a_rejected_call_moves_no_byte(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device pool whose indexer differs from the mirrored one: typed error, no byte moved."""
    backend = sgl_core.get_backend("torch")
    src = _dsa(6)
    host = backend.create_host_pool(src, layout="layer_first")
    idx = torch.arange(0, PAGE)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    other: Any = _dsa(7, [False, False, True] if bad == "skip" else None)
    if bad == "kpool":
        other.index_kpool = 2
    elif bad == "dtype":
        other.index_key_cache.buffer[0] = other.index_k_with_scale_buffer[0].view(torch.int8)
    elif bad == "short":
        other.index_key_cache.buffer[2] = other.index_k_with_scale_buffer[2][:1]
    elif bad == "block":
        other.quant_block_size = KEY // 2  # two scales per key
    elif bad == "preshuffle":
        monkeypatch.setattr(index_key_cache, "_use_aiter_preshuffle", True)
    elif bad in ("width", "dim", "stride", "resized"):
        t = other.index_k_with_scale_buffer[1]
        if bad == "width":
            t = t[:, :-4]
        elif bad == "dim":
            t = t.view(-1)
        elif bad == "stride":
            t = torch.stack([t, t], dim=-1)[..., 0]  # row stride 2
        else:
            t = t.clone()
            t.untyped_storage().resize_(t.nbytes // 2)
        other.index_key_cache.buffer[1] = t
    elif bad == "no_indexer":
        other = _mla()
    snap_host, snap_dev = _host_bytes(host), [t.clone() for t in other.kv_buffer]
    # A resized buffer's missing bytes cannot be read: its layer is left out.
    kept = [
        t
        for t in getattr(other, "index_k_with_scale_buffer", [])
        if t.untyped_storage().nbytes() >= t.nbytes
    ]
    snap_idx = [t.clone() for t in kept]
    with pytest.raises(PoolMismatchError, match="ind"):
        host.load_to_device_per_layer(other, idx, idx, 0, "direct")
    with pytest.raises(PoolMismatchError, match="ind"):
        host.backup_from_device_all_layer(other, idx, idx, "direct")
    assert all(torch.equal(a, b) for a, b in zip(_host_bytes(host), snap_host, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(other.kv_buffer, snap_dev, strict=True))
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for a, b in zip(kept, snap_idx, strict=True))  # fmt: skip


def test_a_host_pool_of_the_plain_mla_pool_refuses_the_dsa_pool() -> None:
    host = sgl_core.get_backend("torch").create_host_pool(_mla(), layout="page_first")
    other = _dsa(8)
    snap = _snapshot(other)
    idx = torch.arange(0, PAGE)
    with pytest.raises(PoolMismatchError, match="indexer"):
        host.load_to_device_per_layer(other, idx, idx, 0, "direct")
    assert _same(other, snap)


def test_wrap_host_pool_refuses_a_folded_indexer() -> None:
    """SGLang moves the indexer as its own INDEXER host pool: a KV entry whose pages
    also carry it would not match SGLang's sizes or storage objects."""
    host = sgl_core.get_backend("torch").create_host_pool(_dsa(9), layout="page_first")
    with pytest.raises(ArgumentTypeError, match="indexer"):
        wrap_host_pool(host)


def test_a_kv_only_page_is_a_miss_for_the_dsa_host_pool(tmp_path: Path) -> None:
    """The same packed KV rows stored without an indexer never load into a pool that
    mirrors one (its page format differs): no KV hit with a stale indexer."""
    backend = sgl_core.get_backend("torch")
    idx = torch.arange(0, 2 * PAGE)
    kv_only = _mla()
    writer = backend.create_host_pool(kv_only, layout="page_first")
    writer.backup_from_device_all_layer(kv_only, idx, idx, "direct")
    store = FilePageStore(tmp_path)
    store.register_host_pool(writer)
    keys = page_keys(list(range(2 * PAGE)), PAGE)
    assert store.batch_set(keys, idx) == [True, True]
    reader = backend.create_host_pool(_dsa(10), layout="page_first")
    store.register_host_pool(reader)
    before = _host_bytes(reader)
    assert store.batch_exists(keys) == 0
    assert store.batch_get(keys, idx) == [False, False]
    assert all(torch.equal(a, b) for a, b in zip(_host_bytes(reader), before, strict=True))
