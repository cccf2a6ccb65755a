"""Pool inspection helpers used by the conformance suite (any backend, any KV kind).

A row, to these helpers, is every byte a token has in one layer (every part,
any kind), read and written through the public accessors only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
import torch

from sgl_core import IndexerCache, KVRows
from sgl_core.backend import is_mha_device_pool
from sgl_core.testing._kinds import DevicePool, HostPool

__all__ = [
    "device_bytes",
    "device_rows",
    "fill_device_random",
    "host_bytes",
    "page_indices",
    "random_bits",
    "read_memory",
    "refused",
    "row_parts",
    "same_bytes",
    "slot_count",
    "snapshot",
    "write_parts",
    "write_random_rows",
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


def slot_count(device_pool: DevicePool) -> int:
    return device_pool.size + device_pool.page_size


def _kv_accessors(device_pool: DevicePool) -> tuple[Callable[..., Any], Callable[..., None], int]:
    """The pool's KV row reader (returning a list), its writer, and how many parts they move."""
    pool: Any = device_pool
    if is_mha_device_pool(device_pool):
        return (lambda *a: list(pool.get_kv_buffer(*a))), pool.set_kv_buffer, 2
    if pool.kv_cache_dim != pool.kv_lora_rank + pool.qk_rope_head_dim:
        assert isinstance(pool, KVRows)
        return (lambda *a: [pool.get_kv_rows(*a)]), pool.set_kv_rows, 1
    return (lambda *a: list(pool.get_mla_kv_buffer(*a))), pool.set_mla_kv_buffer, 2


def write_parts(
    device_pool: DevicePool, layer_id: int, loc: torch.Tensor, parts: list[torch.Tensor]
) -> None:
    """Write ``parts`` (as ``row_parts`` reads them) into one layer's rows at ``loc``."""
    _, write, count = _kv_accessors(device_pool)
    write(layer_id, loc, *parts[:count])
    if parts[count:]:  # the layer's indexer key (and scale)
        assert isinstance(device_pool, IndexerCache)
        device_pool.set_index_k_buffer(layer_id, loc, *parts[count:])


def write_random_rows(
    device_pool: DevicePool, layer_id: int, loc: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """Write random bits into every part of one layer's rows at ``loc``; return ``device_rows``."""
    parts = [
        random_bits(tuple(p.shape), p.dtype, generator)
        for p in row_parts(device_pool, layer_id, loc)
    ]
    write_parts(device_pool, layer_id, loc, parts)
    return _row_bytes(parts, loc.numel())


def fill_device_random(device_pool: DevicePool, seed: int) -> None:
    """Write random bits into every slot of every layer (every row part) through the API."""
    gen = torch.Generator().manual_seed(seed)
    loc = torch.arange(slot_count(device_pool), dtype=torch.int64)
    for layer in range(device_pool.layer_num):
        write_random_rows(device_pool, layer, loc, gen)


def _row_bytes(parts: list[torch.Tensor], n: int) -> torch.Tensor:
    return torch.cat([p.reshape(n, -1).contiguous().cpu().view(torch.uint8) for p in parts], dim=-1)


def row_parts(device_pool: DevicePool, layer_id: int, loc: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a layer's rows are read as: K and V, or the KV row (and indexer parts)."""
    parts: list[torch.Tensor] = _kv_accessors(device_pool)[0](layer_id, loc)
    if (  # the layer's indexer key (and scale)
        isinstance(device_pool, IndexerCache)
        and device_pool.index_head_dim is not None
        and device_pool.indexer_slot(layer_id) is not None
    ):
        keys, scales = device_pool.get_index_k_buffer(layer_id, loc)
        parts += [keys] if scales is None else [keys, scales]
    return parts


def device_rows(device_pool: DevicePool, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
    """Rows of one layer as raw bytes (uint8, ``(n, bytes)``), on CPU.

    MLA: the KV row, followed by the layer's indexer key and scale bytes when
    it has an indexer slot; MHA: the K row, then the V row. So every check
    that compares rows covers every part.
    """
    return _row_bytes(row_parts(device_pool, layer_id, loc), loc.numel())


def host_bytes(host_pool: HostPool) -> list[torch.Tensor]:
    """Every host page's flat bytes, in page order."""
    host_pool.synchronize()  # transfers may still be in flight on a stream
    return [
        host_pool.get_data_page(start).contiguous().view(torch.uint8).clone()
        for start in range(0, host_pool.size, host_pool.page_size)
    ]


def device_bytes(device_pool: DevicePool) -> list[torch.Tensor]:
    """Every slot's rows of every layer (``device_rows``), comparable with ``same_bytes``."""
    loc = torch.arange(slot_count(device_pool), dtype=torch.int64)
    return [device_rows(device_pool, layer, loc) for layer in range(device_pool.layer_num)]


def snapshot(device_pool: DevicePool, host_pool: HostPool) -> list[torch.Tensor]:
    """All bytes of both pools, comparable with ``same_bytes``."""
    return device_bytes(device_pool) + host_bytes(host_pool)


def same_bytes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def refused(
    error: type[Exception],
    device_pool: DevicePool,
    call: Callable[..., object],
    *args: object,
    match: str | None = None,
) -> None:
    """``call(*args)`` raises ``error`` (matching ``match``); ``device_pool`` keeps every byte."""
    before = device_bytes(device_pool)
    with pytest.raises(error, match=match):
        call(*args)
    assert same_bytes(before, device_bytes(device_pool)), (
        f"a refused call ({error.__name__}) changed the pool"
    )


def read_memory(ptr: int, nbytes: int) -> bytes:
    """Bytes at a host address (for checking L3 buffer metadata)."""
    return ctypes.string_at(ptr, nbytes)
