"""Pool inspection helpers used by the conformance suite (any backend)."""

from __future__ import annotations

import ctypes

import torch

from sgl_core._dsa_protocols import IndexerCache, KVRows
from sgl_core._kv_protocols import MLADevicePool, MLAHostPool

__all__ = [
    "device_rows",
    "fill_device_random",
    "host_bytes",
    "indexer_slot",
    "is_packed",
    "page_indices",
    "random_bits",
    "read_memory",
    "same_bytes",
    "slot_count",
    "snapshot",
]

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def random_bits(
    shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator
) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (NaN payloads included: compare bytes, not values)."""
    int_dtype = _INT_OF_SIZE[torch.empty((), dtype=dtype).element_size()]
    info = torch.iinfo(int_dtype)
    raw = torch.randint(info.min, info.max, shape, dtype=torch.int64, generator=generator)
    return raw.to(int_dtype).view(dtype)


def page_indices(pages: list[int] | torch.Tensor, page_size: int) -> torch.Tensor:
    """Token indices of whole pages, in the given page order."""
    p = torch.as_tensor(pages, dtype=torch.int64)
    return (p[:, None] * page_size + torch.arange(page_size, dtype=torch.int64)).flatten()


def slot_count(device_pool: MLADevicePool) -> int:
    return device_pool.size + device_pool.page_size


def is_packed(device_pool: MLADevicePool) -> bool:
    """Rows of ``kv_cache_dim`` engine-packed elements (only the raw-row accessors apply)."""
    return device_pool.kv_cache_dim != device_pool.kv_lora_rank + device_pool.qk_rope_head_dim


def indexer_slot(device_pool: MLADevicePool, layer_id: int) -> int | None:
    """The layer's indexer slot, None when the pool (or the layer) has no indexer."""
    if not isinstance(device_pool, IndexerCache) or device_pool.index_head_dim is None:
        return None
    return device_pool.indexer_slot(layer_id)


def fill_device_random(device_pool: MLADevicePool, seed: int) -> None:
    """Write random bits into every slot of every layer (and indexer row) through the API."""
    gen = torch.Generator().manual_seed(seed)
    n = slot_count(device_pool)
    loc = torch.arange(n, dtype=torch.int64)
    dtype = device_pool.dtype
    for layer in range(device_pool.layer_num):
        if is_packed(device_pool):
            assert isinstance(device_pool, KVRows)
            device_pool.set_kv_rows(
                layer, loc, random_bits((n, device_pool.kv_cache_dim), dtype, gen)
            )
        else:
            nope = random_bits((n, 1, device_pool.kv_lora_rank), dtype, gen)
            rope = random_bits((n, 1, device_pool.qk_rope_head_dim), dtype, gen)
            device_pool.set_mla_kv_buffer(layer, loc, nope, rope)
        if indexer_slot(device_pool, layer) is not None:
            assert isinstance(device_pool, IndexerCache)
            assert device_pool.index_head_dim is not None
            keys = random_bits((n, 1, device_pool.index_head_dim), dtype, gen)
            scale = None
            if device_pool.has_index_k_scale:
                scale = random_bits((n, 1, 1), torch.float32, gen)
            device_pool.set_index_k_buffer(layer, loc, keys, scale)


def device_rows(device_pool: MLADevicePool, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
    """Rows of one layer as raw bytes (uint8, ``(n, bytes)``), on CPU.

    The KV row, followed by the layer's indexer key and scale bytes when it
    has an indexer slot: so every check that compares rows covers both.
    """
    if is_packed(device_pool):
        assert isinstance(device_pool, KVRows)
        parts = [device_pool.get_kv_rows(layer_id, loc)]
    else:
        parts = list(device_pool.get_mla_kv_buffer(layer_id, loc))
    if indexer_slot(device_pool, layer_id) is not None:
        assert isinstance(device_pool, IndexerCache)
        keys, scales = device_pool.get_index_k_buffer(layer_id, loc)
        parts += [keys] if scales is None else [keys, scales]
    n = loc.numel()
    return torch.cat([p.reshape(n, -1).contiguous().cpu().view(torch.uint8) for p in parts], dim=-1)


def host_bytes(host_pool: MLAHostPool) -> list[torch.Tensor]:
    """Every host page's flat bytes, in page order."""
    host_pool.synchronize()  # transfers may still be in flight on a stream
    return [
        host_pool.get_data_page(start).contiguous().view(torch.uint8).clone()
        for start in range(0, host_pool.size, host_pool.page_size)
    ]


def snapshot(device_pool: MLADevicePool, host_pool: MLAHostPool) -> list[torch.Tensor]:
    """All bytes of both pools, comparable with ``same_bytes``."""
    loc = torch.arange(slot_count(device_pool), dtype=torch.int64)
    dev = [device_rows(device_pool, layer, loc) for layer in range(device_pool.layer_num)]
    return dev + host_bytes(host_pool)


def same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def read_memory(ptr: int, nbytes: int) -> bytes:
    """Bytes at a host address (for checking L3 buffer metadata)."""
    return ctypes.string_at(ptr, nbytes)
