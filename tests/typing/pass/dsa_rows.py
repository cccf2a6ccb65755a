"""Every shipped device pool is a ``KVRows`` and an ``IndexerCache`` (DeepSeek-V3.2 rows).

An engine that quantizes its own rows types its code against these capability
protocols. Type-checked only; nothing here is executed.
"""

from __future__ import annotations

import torch

import sgl_ascend
import sgl_core
import sgl_core.backend
import sgl_cuda
from sgl_core import IndexerCache, KVRows


def raw_row_pools(
    torch_pool: sgl_core.backend.PerLayerMLADevicePool,
    cuda_pool: sgl_cuda.CudaMLADevicePool,
    ascend_pool: sgl_ascend.AscendMLADevicePool,
) -> list[KVRows]:
    return [torch_pool, cuda_pool, ascend_pool]


def indexer_pools(
    torch_pool: sgl_core.backend.PerLayerMLADevicePool,
    cuda_pool: sgl_cuda.CudaMLADevicePool,
    ascend_pool: sgl_ascend.AscendMLADevicePool,
) -> list[IndexerCache]:
    return [torch_pool, cuda_pool, ascend_pool]


def write_fp8_rows(backend: sgl_core.Backend, rows: torch.Tensor, keys: torch.Tensor) -> None:
    pool = backend.create_device_pool(
        size=64,
        page_size=64,
        dtype=torch.uint8,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        layer_num=61,
        kv_cache_dim=656,
        index_head_dim=128,
        with_index_k_scale=True,
    )
    loc = torch.arange(rows.shape[0])
    if isinstance(pool, KVRows):
        pool.set_kv_rows(0, loc, rows)
        got: torch.Tensor = pool.get_kv_rows(0, loc)
        assert got.shape == rows.shape
    if isinstance(pool, IndexerCache) and pool.index_head_dim is not None:
        pool.set_index_k_buffer(0, loc, keys, torch.ones(rows.shape[0], 1, 1))
