"""SGLang's own device pools (MLA, MHA, DSA) given straight to our host pools.

* SGLang stores fp8 as ``uint8`` (``store_dtype``) and names the flavour in
  ``dtype``: our host pools and L3 page formats carry the flavour, so an
  e4m3 page is a miss for an e5m2 pool (never a verified wrong hit);
* the size members of ``wrap_host_pool`` equal SGLang's own host pool's for
  the same device pool (packed DeepSeek-V3.2 rows included);
* a host pool's own transfers take SGLang's pool, as ``create_host_pool`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.integrations.sglang import wrap_host_pool
from sgl_core.l3 import FilePageStore, page_format, page_keys

from sglang.srt.mem_cache.memory_pool import (  # isort: skip
    DSATokenToKVPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
)
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # isort: skip
from sglang.srt.runtime_context import get_parallel  # isort: skip

PAGE, LAYERS = 4, 2
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fill(layers: list[torch.Tensor], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in layers:
        raw = torch.randint(0, 256, (t.nbytes,), dtype=torch.uint8, generator=gen)
        t.view(torch.uint8).view(-1).copy_(raw)


def _mla(dtype: torch.dtype, seed: int = 0) -> MLATokenToKVPool:
    pool = MLATokenToKVPool(
        size=64, page_size=PAGE, dtype=dtype, kv_lora_rank=16, qk_rope_head_dim=8,
        layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    _fill(pool.kv_buffer, seed)
    return pool


def _mha(dtype: torch.dtype, seed: int = 0) -> MHATokenToKVPool:
    pool = MHATokenToKVPool(
        size=64, page_size=PAGE, dtype=dtype, head_num=2, head_dim=8, layer_num=LAYERS,
        device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    _fill(pool.k_buffer + pool.v_buffer, seed)
    return pool


def _dsa(seed: int = 0) -> DSATokenToKVPool:
    """DeepSeek-V3.2's pool: 656 packed fp8 bytes a row (64-token pages, as SGLang requires)."""
    with get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0):
        pool = DSATokenToKVPool(
            size=128, page_size=64, kv_lora_rank=512, dtype=E4M3, qk_rope_head_dim=64,
            layer_num=LAYERS, device="cpu", index_head_dim=128, enable_memory_saver=False,
            kv_cache_dim=656,
        )  # fmt: skip
    _fill(pool.kv_buffer, seed)
    return pool


def _pairs(backend: Any, kind: str) -> list[tuple[str, str]]:
    pairs = backend.supported_pairs if kind == "mla" else backend.supported_mha_pairs
    return [(lay.value, io.value) for lay, ios in pairs.items() for io in sorted(ios)]


def _engine(kind: str, dtype: torch.dtype, seed: int = 0) -> Any:
    return _mla(dtype, seed) if kind == "mla" else _mha(dtype, seed)


def _layers(pool: Any) -> list[torch.Tensor]:
    return list(pool.kv_buffer) if hasattr(pool, "kv_buffer") else pool.k_buffer + pool.v_buffer


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_an_e4m3_page_is_a_miss_for_an_e5m2_pool(kind: str, tmp_path: Path) -> None:
    backend = sgl_core.get_backend("torch")
    idx = torch.arange(PAGE, 3 * PAGE)
    keys = page_keys(list(range(2 * PAGE)), PAGE)
    for layout, io in _pairs(backend, kind):
        e4m3, e5m2 = _engine(kind, E4M3), _engine(kind, E5M2)  # equal stored bytes
        assert e4m3.store_dtype == e5m2.store_dtype == torch.uint8
        writer = backend.create_host_pool(e4m3, layout=layout)
        reader = backend.create_host_pool(e5m2, layout=layout)
        assert (writer.dtype, reader.dtype) == (E4M3, E5M2)
        writer.backup_from_device_all_layer(e4m3, idx, idx, io)
        store = FilePageStore(tmp_path / kind / layout / io)
        store.register_host_pool(writer)
        assert store.batch_set(keys, idx) == [True, True]
        store.register_host_pool(reader)
        assert store.batch_exists(keys) == 0
        before = reader.get_data_page(PAGE).clone()
        assert store.batch_get(keys, idx) == [False, False]
        assert torch.equal(reader.get_data_page(PAGE).view(torch.uint8), before.view(torch.uint8))
        same = backend.create_host_pool(_engine(kind, E4M3, 1), layout=layout)
        store.register_host_pool(same)
        assert store.batch_get(keys, idx) == [True, True]
        assert torch.equal(
            same.get_data_page(PAGE).view(torch.uint8),
            writer.get_data_page(PAGE).view(torch.uint8),
        )


def test_a_dsa_pool_is_mirrored_as_the_fp8_flavour_it_means() -> None:
    dev = _dsa()
    assert (dev.dtype, dev.store_dtype, dev.kv_cache_dim) == (E4M3, torch.uint8, 656)
    host = sgl_core.get_backend("torch").create_host_pool(dev, layout="page_first_direct")
    assert host.dtype == E4M3 and page_format(host).dtype == str(E4M3)
    assert host.kv_cache_dim == 656
    idx = torch.arange(64, 128)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    # The flat page: the KV part (layer, token), then the indexer's keys and scales.
    kv = LAYERS * 64 * 656
    page = host.get_data_page(64).view(torch.uint8)
    assert page.numel() == kv + LAYERS * 64 * (128 + 4)
    for layer in range(LAYERS):
        assert torch.equal(page[:kv].view(LAYERS, 64, 656)[layer], dev.kv_buffer[layer][idx, 0])


def _theirs(dev: MLATokenToKVPool, layout: str) -> MLATokenToKVPoolHost:
    """SGLang's own host pool of ``dev``, built as SGLang's assembler builds it."""
    return MLATokenToKVPoolHost(
        dev._mla_buffer_info(), 2.0, 0, dev.page_size, layout, pin_memory=False,
        device="cpu", device_capacity_tokens=dev.size, start_layer=0,
        end_layer=LAYERS - 1, target_layer_num=LAYERS, override_kv_cache_dim=dev.kv_cache_dim,
    )  # fmt: skip


def _packed() -> MLATokenToKVPool:
    """DeepSeek-V3.2's packed 656-byte rows without the indexer (a DSA pool's host pool
    with its indexer mirrored is refused by ``wrap_host_pool``: test_sglang_dsa_indexer)."""
    pool = MLATokenToKVPool(
        size=128, page_size=64, dtype=E4M3, kv_lora_rank=512, qk_rope_head_dim=64,
        layer_num=LAYERS, device="cpu", enable_memory_saver=False, use_dsa=True,
        override_kv_cache_dim=656,
    )  # fmt: skip
    assert pool.kv_cache_dim == 656
    _fill(pool.kv_buffer, 0)
    return pool


@pytest.mark.parametrize("which", ["packed", "fp8", "bf16"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_size_members_equal_sglangs_host_pool(which: str, layout: str) -> None:
    dev = _packed() if which == "packed" else _mla(E4M3 if which == "fp8" else torch.bfloat16)
    ours = wrap_host_pool(sgl_core.get_backend("torch").create_host_pool(dev, layout=layout))
    theirs = _theirs(dev, layout)
    for name in (
        "kv_cache_dim", "token_stride_size", "layout_dim", "size_per_token", "page_size",
        "layer_num", "kv_lora_rank", "qk_rope_head_dim",
    ):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.get_size_per_token() == theirs.get_size_per_token()
    assert ours.get_ksize_per_token() == theirs.get_ksize_per_token()
    assert ours.get_page_buffer_element_size() == theirs.get_page_buffer_element_size()
    assert ours.get_dummy_flat_data_page().nbytes == theirs.get_dummy_flat_data_page().nbytes
    # SGLang's controller and backends size a page from these: a page's real bytes.
    page_bytes = sum(ours.get_page_buffer_meta(list(range(ours.page_size)))[1])
    assert ours.size_per_token * ours.page_size == page_bytes
    # The dtype is the one the engine means (SGLang's host pool reports its store dtype).
    assert ours.dtype == dev.dtype and theirs.dtype == dev.store_dtype


@pytest.mark.parametrize("backend_name", ["torch", "cuda"])
@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_a_host_pools_own_transfers_take_sglangs_pool(backend_name: str, kind: str) -> None:
    backend = sgl_core.get_backend(backend_name)
    src_idx, host_idx, dst_idx = torch.arange(4, 12), torch.arange(8, 16), torch.arange(20, 28)
    for layout, io in _pairs(backend, kind):
        src = _engine(kind, E5M2, 2)
        host = backend.create_host_pool(src, layout=layout)
        host.backup_from_device_all_layer(src, host_idx, src_idx, io)
        dst = _engine(kind, E5M2, 3)
        for layer in range(LAYERS):
            host.load_to_device_per_layer(dst, host_idx, dst_idx, layer, io)
        for a, b in zip(_layers(src), _layers(dst), strict=True):
            assert a.dtype == b.dtype == torch.uint8  # SGLang's own tensors
            assert torch.equal(a[src_idx], b[dst_idx]), (layout, io)
