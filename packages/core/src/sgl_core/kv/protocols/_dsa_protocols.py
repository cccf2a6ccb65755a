"""Capability protocols of MLA device pools for DeepSeek-V3.2-style caches.

Engines check for these (``isinstance``) or type against them; every shipped
device pool satisfies both (docs/design.md section 5, "DeepSeek-V3.2 rows").
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["IndexerCache", "KVRows"]


@runtime_checkable
class KVRows(Protocol):
    """A device pool whose raw token rows an engine can write and read (every shipped pool).

    Rows are ``(n, kv_cache_dim)`` tensors of the pool's dtype, moved as
    bytes with no conversion: the way to fill a pool built with
    ``kv_cache_dim`` (packed rows the engine quantizes itself, e.g.
    DeepSeek-V3.2's 656-byte FP8 rows), whose split accessors
    ``set_mla_kv_buffer`` / ``get_mla_kv_buffer`` raise ``PoolMismatchError``.
    """

    def set_kv_rows(self, layer_id: int, loc: torch.Tensor, rows: torch.Tensor) -> None: ...

    def get_kv_rows(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class IndexerCache(Protocol):
    """A device pool with a sparse-attention (DSA) indexer cache (docs/design.md section 5).

    ``index_head_dim`` is None when the pool has no indexer; the indexer
    accessors then raise ``LayerIndexError`` for every layer.
    """

    @property
    def index_head_dim(self) -> int | None: ...
    @property
    def indexer_layer_ids(self) -> tuple[int, ...]: ...
    @property
    def has_index_k_scale(self) -> bool: ...

    def indexer_slot(self, layer_id: int) -> int | None: ...

    def set_index_k_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor | None = None,
    ) -> None:
        """Write ``(n, 1, index_head_dim)`` keys (and ``(n, 1, 1)`` float32 scales) at ``loc``."""
        ...

    def get_index_k_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...
