"""MHA pool inspection helpers (the MHA siblings of ``_helpers``), any backend."""

from __future__ import annotations

import torch

from sgl_core._kv_protocols import MHADevicePool, MHAHostPool
from sgl_core.testing._helpers import random_bits

__all__ = [
    "fill_mha_device_random",
    "mha_device_rows",
    "mha_host_bytes",
    "mha_snapshot",
]


def fill_mha_device_random(device_pool: MHADevicePool, seed: int) -> None:
    """Write random bits into K and V of every slot of every layer (public API only)."""
    gen = torch.Generator().manual_seed(seed)
    n = device_pool.size + device_pool.page_size
    loc = torch.arange(n, dtype=torch.int64)
    heads = device_pool.head_num
    for layer in range(device_pool.layer_num):
        k = random_bits((n, heads, device_pool.head_dim), device_pool.dtype, gen)
        v = random_bits((n, heads, device_pool.v_head_dim), device_pool.dtype, gen)
        device_pool.set_kv_buffer(layer, loc, k, v)


def mha_device_rows(device_pool: MHADevicePool, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
    """Rows ``(n, K bytes + V bytes)`` of one layer as raw bytes (uint8), on CPU."""
    k, v = device_pool.get_kv_buffer(layer_id, loc)
    n = loc.numel()
    parts = [t.reshape(n, -1).contiguous().cpu().view(torch.uint8) for t in (k, v)]
    return torch.cat(parts, dim=1)


def mha_host_bytes(host_pool: MHAHostPool) -> list[torch.Tensor]:
    """Every host page's flat bytes, in page order."""
    host_pool.synchronize()
    return [
        host_pool.get_data_page(start).contiguous().view(torch.uint8).clone()
        for start in range(0, host_pool.size, host_pool.page_size)
    ]


def mha_snapshot(device_pool: MHADevicePool, host_pool: MHAHostPool) -> list[torch.Tensor]:
    """All bytes of both pools, comparable with ``same_bytes``."""
    loc = torch.arange(device_pool.size + device_pool.page_size, dtype=torch.int64)
    dev = [mha_device_rows(device_pool, layer, loc) for layer in range(device_pool.layer_num)]
    return dev + mha_host_bytes(host_pool)
