"""The per-layer device pools of the torch backend (and, subclassed, cuda), both kinds
(MHA: SGLang's ``MHATokenToKVPool`` field names; docs/design.md sections 5a, 5b)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sgl_core.kv._validation import check_layer_id, check_value_rows
from sgl_core.kv.device._device_kinds import MHADevicePoolBase, MLADevicePoolBase
from sgl_core.kv.device._device_rows import PerLayerRows, check_raw_rows
from sgl_core.kv.device._indexer import IndexerConfig, IndexerRows, mla_pool_spec
from sgl_core.kv.protocols._kv_protocols import MHADevicePool
from sgl_core.transfer.copy._copy import byte_view

__all__ = ["PerLayerMHADevicePool", "PerLayerMLADevicePool"]


class PerLayerMLADevicePool(MLADevicePoolBase, PerLayerRows, IndexerRows):
    """``kv_buffer[layer]`` is a ``(size + page_size, 1, kv_cache_dim)`` tensor; packed rows
    and the indexer cache: docs/design.md section 5a, "DeepSeek-V3.2 rows"."""

    kv_buffer: list[torch.Tensor]

    def _allocate(self, indexer: IndexerConfig | None) -> None:
        self.spec = mla_pool_spec(self.shape, indexer)
        self.index_k_buffer = None
        self.index_k_scale_buffer = None
        self._allocate_rows()  # kv_buffer, and index_k_buffer / index_k_scale_buffer

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[check_layer_id(layer_id, self.layer_num)]

    def set_mla_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        loc = self._check_loc(layer_id, loc)
        if self.shape.packed:
            raise self._split_rows_error("set_mla_kv_buffer")
        n = loc.numel()
        check_value_rows(cache_k_nope, "cache_k_nope", (n, 1, self.kv_lora_rank), self.dtype)
        check_value_rows(cache_k_rope, "cache_k_rope", (n, 1, self.qk_rope_head_dim), self.dtype)
        # fp8 caches move as bytes (no fp8 index kernels).
        parts = [byte_view(t.to(self.device)) for t in (cache_k_nope, cache_k_rope)]
        byte_view(self.kv_buffer[layer_id]).index_copy_(0, loc, torch.cat(parts, dim=-1))

    def get_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self._check_loc(layer_id, loc)
        if self.shape.packed:
            raise self._split_rows_error("get_mla_kv_buffer")
        rows = byte_view(self.kv_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        return rows[..., : self.kv_lora_rank], rows[..., self.kv_lora_rank :]

    # ------------------------------------------------------------- raw rows
    def set_kv_rows(self, layer_id: int, loc: torch.Tensor, rows: torch.Tensor) -> None:
        """Write raw ``(n, kv_cache_dim)`` rows of the pool's dtype at token ``loc``.

        The bytes land as given (no conversion): rows of another dtype or
        shape are ``PoolMismatchError``, before anything is written.
        """
        loc = self._check_loc(layer_id, loc)
        check_raw_rows(rows, loc.numel(), self.kv_cache_dim, self.dtype)
        byte_view(self.kv_buffer[layer_id][:, 0]).index_copy_(
            0, loc, byte_view(rows.to(self.device).contiguous())
        )

    def get_kv_rows(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """A copy of the raw ``(n, kv_cache_dim)`` rows at token ``loc``, of the pool's dtype."""
        loc = self._check_loc(layer_id, loc)
        return byte_view(self.kv_buffer[layer_id][:, 0]).index_select(0, loc).view(self.dtype)


class PerLayerMHADevicePool(MHADevicePoolBase, PerLayerRows):
    """``k_buffer[layer]`` / ``v_buffer[layer]``: one K and one V tensor per layer
    (``layers_in_one_allocation``: see ``sgl_core.kv.device._device_rows``)."""

    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]

    def _allocate(self) -> None:
        self.spec = self.shape.spec
        self._allocate_rows()  # k_buffer, v_buffer

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[check_layer_id(layer_id, self.layer_num)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[check_layer_id(layer_id, self.layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None:
        loc = self._check_loc(layer_id, loc)
        n, heads = loc.numel(), self.head_num
        check_value_rows(cache_k, "cache_k", (n, heads, self.head_dim), self.dtype)
        check_value_rows(cache_v, "cache_v", (n, heads, self.v_head_dim), self.dtype)
        # fp8 caches move as bytes (no fp8 index kernels).
        for layers, tensor in ((self.k_buffer, cache_k), (self.v_buffer, cache_v)):
            rows = byte_view(tensor.to(self.device).contiguous())
            byte_view(layers[layer_id]).index_copy_(0, loc, rows)

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self._check_loc(layer_id, loc)
        k = byte_view(self.k_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        v = byte_view(self.v_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        return k, v


if TYPE_CHECKING:
    _pool: MHADevicePool = PerLayerMHADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
    )
