"""Contiguous multi-layer MLA device pool of the Ascend backend (docs/design.md section 5).

Each component is one contiguous, layer-major 5-D tensor::

    k_buffer             (layer_num,          page_num, page_size, 1, kv_lora_rank)
    v_buffer             (layer_num,          page_num, page_size, 1, qk_rope_head_dim)
    index_k_buffer       (num_indexer_layers, page_num, page_size, 1, index_head_dim)  optional
    index_k_scale_buffer (num_indexer_layers, page_num, page_size, 1, 1) float32       optional

With ``kv_cache_dim`` (packed rows the engine quantizes itself, e.g. 656
``uint8`` for DeepSeek-V3.2's FP8 MLA) ``k_buffer`` holds the whole row,
``(..., kv_cache_dim)``, and there is no ``v_buffer`` (None).

``page_num = size // page_size + 1``: token slots ``[0, size + page_size)``
are valid and token ``t`` lives at page ``t // page_size``, offset
``t % page_size``. There is no ``data_ptrs`` table and no per-layer list:
code that needs one of those must not receive this pool.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from sgl_ascend import _npu
from sgl_core import MLAPoolGeometry
from sgl_core.backend import (
    byte_view,
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
    check_raw_rows,
    check_value_rows,
)
from sgl_core.errors import LayerIndexError, PoolMismatchError, PoolSizeError

__all__ = ["AscendMLADevicePool"]


class AscendMLADevicePool(MLAPoolGeometry):
    """Layer-major contiguous MLA KV cache, optionally with a DSA/NSA indexer cache.

    Pass ``index_head_dim`` to add ``index_k_buffer`` for the layers in
    ``indexer_layer_ids`` (default: every layer), and ``with_index_k_scale``
    to add its fp32 per-token scale. ``indexer_slot(layer_id)`` maps a model
    layer to its row in the indexer buffers.
    """

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        kv_cache_dim: int | None = None,
        index_head_dim: int | None = None,
        indexer_layer_ids: Iterable[int] | None = None,
        with_index_k_scale: bool = False,
    ) -> None:
        super().__init__(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            layer_num=layer_num,
            device=_npu.resolve_device(device),
            kv_cache_dim=kv_cache_dim,
        )
        self._index_head_dim = index_head_dim
        self._indexer_layer_ids = self._check_indexer(
            index_head_dim, indexer_layer_ids, with_index_k_scale
        )
        self._slots = {layer: i for i, layer in enumerate(self._indexer_layer_ids)}
        pages = (layer_num, self.page_num, page_size, 1)
        self.v_buffer: torch.Tensor | None = None
        if self.shape.packed:
            self.k_buffer = self._zeros((*pages, self.kv_cache_dim), dtype)
        else:
            self.k_buffer = self._zeros((*pages, kv_lora_rank), dtype)
            self.v_buffer = self._zeros((*pages, qk_rope_head_dim), dtype)
        self.index_k_buffer: torch.Tensor | None = None
        self.index_k_scale_buffer: torch.Tensor | None = None
        if index_head_dim is not None:
            ipages = (len(self._indexer_layer_ids), self.page_num, page_size, 1)
            self.index_k_buffer = self._zeros((*ipages, index_head_dim), dtype)
            if with_index_k_scale:
                self.index_k_scale_buffer = self._zeros((*ipages, 1), torch.float32)

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        try:
            return torch.zeros(shape, dtype=dtype, device=self._device)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"device pool does not fit on {self._device}: {exc}") from None

    def _check_indexer(
        self,
        index_head_dim: int | None,
        indexer_layer_ids: Iterable[int] | None,
        with_index_k_scale: bool,
    ) -> tuple[int, ...]:
        if index_head_dim is None:
            if indexer_layer_ids is not None or with_index_k_scale:
                raise PoolSizeError(
                    "indexer_layer_ids / with_index_k_scale need index_head_dim to be set"
                )
            return ()
        if isinstance(index_head_dim, bool) or not isinstance(index_head_dim, int):
            raise PoolSizeError(f"index_head_dim must be a positive int, got {index_head_dim!r}")
        if index_head_dim <= 0:
            raise PoolSizeError(f"index_head_dim must be a positive int, got {index_head_dim!r}")
        ids = range(self.layer_num) if indexer_layer_ids is None else list(indexer_layer_ids)
        for layer in ids:
            try:
                check_layer_id(layer, self.layer_num)
            except LayerIndexError as exc:
                raise LayerIndexError(f"indexer_layer_ids: {exc}") from None
        if len(set(ids)) != len(ids) or not ids:
            raise PoolSizeError(
                f"indexer_layer_ids must be distinct and non-empty, got {list(ids)}"
            )
        return tuple(sorted(ids))

    # ------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return self.k_buffer.device

    @property
    def index_head_dim(self) -> int | None:
        return self._index_head_dim

    @property
    def indexer_layer_ids(self) -> tuple[int, ...]:
        """Model layers that have an indexer cache, ascending (empty: no indexer)."""
        return self._indexer_layer_ids

    @property
    def has_index_k_scale(self) -> bool:
        return self.index_k_scale_buffer is not None

    @property
    def components(self) -> list[torch.Tensor]:
        """k[, v][, index_k[, index_k_scale]]: the buffers a host page mirrors, in flat order."""
        return [b for _, b in self.named_components]

    @property
    def named_components(self) -> list[tuple[str, torch.Tensor]]:
        """``(attribute name, buffer)`` of each component present, in flat order."""
        names = ("k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer")
        return [(n, b) for n in names if (b := getattr(self, n)) is not None]

    @property
    def kv_components(self) -> int:
        """How many leading components hold the KV row (1 when rows are packed)."""
        return 1 if self.v_buffer is None else 2

    def indexer_slot(self, layer_id: int) -> int | None:
        """Row of ``layer_id`` in the indexer buffers, or None if it has no indexer."""
        return self._slots.get(check_layer_id(layer_id, self.layer_num))

    # ------------------------------------------------------------ token rows
    def _rows(self, buffer: torch.Tensor, row: int) -> torch.Tensor:
        """``(slot_count, 1, dim)`` view of one layer of a 5-D component (fp8 as bytes)."""
        return byte_view(buffer[row].view(self.slot_count, 1, buffer.shape[-1]))

    def _check_loc(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        layer_id = check_layer_id(layer_id, self.layer_num)
        check_index_tensor(loc, "loc")
        check_index_device(loc, "loc", self.device)
        check_index_bounds(loc, self.slot_count, "loc")
        return loc.to(self.device)

    @staticmethod
    def _check_rows(
        name: str, tensor: object, n: int, dim: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """``(n, 1, dim)`` rows of ``dtype`` with values (no conversion), else a typed error."""
        return check_value_rows(tensor, name, (n, 1, dim), dtype)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, 1, kv_lora_rank)`` view of one layer's latent cache."""
        return self.k_buffer[check_layer_id(layer_id, self.layer_num)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, 1, qk_rope_head_dim)`` view of one layer's rope cache."""
        return self._split_v("get_value_buffer")[check_layer_id(layer_id, self.layer_num)]

    def _split_v(self, what: str) -> torch.Tensor:
        if self.v_buffer is None:
            raise PoolMismatchError(
                f"{what}: this pool's rows are {self.kv_cache_dim} packed {self.dtype} elements "
                f"(kv_cache_dim given), not kv_lora_rank={self.kv_lora_rank} + "
                f"qk_rope_head_dim={self.qk_rope_head_dim} values; use set_kv_rows / get_kv_rows"
            )
        return self.v_buffer

    def set_mla_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        """Write ``(n, 1, kv_lora_rank)`` / ``(n, 1, qk_rope_head_dim)`` rows at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        v_buffer = self._split_v("set_mla_kv_buffer")
        n = loc.numel()
        nope = self._check_rows("cache_k_nope", cache_k_nope, n, self.kv_lora_rank, self.dtype)
        rope = self._check_rows("cache_k_rope", cache_k_rope, n, self.qk_rope_head_dim, self.dtype)
        k_rows = self._rows(self.k_buffer, layer_id)
        v_rows = self._rows(v_buffer, layer_id)
        # fp8 caches move as bytes (no fp8 index kernels); values are never converted.
        k_rows.index_copy_(0, loc, byte_view(nope.to(self.device)))
        v_rows.index_copy_(0, loc, byte_view(rope.to(self.device)))

    def get_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the ``(k_nope, k_rope)`` rows at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        v_buffer = self._split_v("get_mla_kv_buffer")
        return (
            self._rows(self.k_buffer, layer_id).index_select(0, loc).view(self.dtype),
            self._rows(v_buffer, layer_id).index_select(0, loc).view(self.dtype),
        )

    def set_kv_rows(self, layer_id: int, loc: torch.Tensor, rows: torch.Tensor) -> None:
        """Write raw ``(n, kv_cache_dim)`` rows of the pool's dtype (no conversion) at ``loc``."""
        loc = self._check_loc(layer_id, loc)
        check_raw_rows(rows, loc.numel(), self.kv_cache_dim, self.dtype)
        raw = byte_view(rows.to(self.device).contiguous())
        start = 0
        for buffer in self.components[: self.kv_components]:
            width = buffer.shape[-1]
            part = raw[:, start : start + width].unsqueeze(1)
            self._rows(buffer, layer_id).index_copy_(0, loc, part)
            start += width

    def get_kv_rows(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """A copy of the raw ``(n, kv_cache_dim)`` rows at ``loc``, of the pool's dtype."""
        loc = self._check_loc(layer_id, loc)
        parts = [
            self._rows(b, layer_id).index_select(0, loc)[:, 0]
            for b in self.components[: self.kv_components]
        ]
        return torch.cat(parts, dim=-1).view(self.dtype)

    # --------------------------------------------------------------- indexer
    def _indexer_row(self, layer_id: int) -> int:
        slot = self.indexer_slot(layer_id)
        if slot is None:
            raise LayerIndexError(
                f"layer_id={layer_id} has no indexer cache "
                f"(indexer_layer_ids={list(self._indexer_layer_ids)})"
            )
        return slot

    def set_index_k_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor | None = None,
    ) -> None:
        """Write ``(n, 1, index_head_dim)`` indexer keys (and ``(n, 1, 1)`` fp32 scales)."""
        loc = self._check_loc(layer_id, loc)
        slot = self._indexer_row(layer_id)
        assert self.index_k_buffer is not None
        assert self._index_head_dim is not None
        keys = self._check_rows("index_k", index_k, loc.numel(), self._index_head_dim, self.dtype)
        scale_buf = self.index_k_scale_buffer
        if (index_k_scale is None) != (scale_buf is None):
            raise PoolMismatchError(
                "index_k_scale must be given exactly when the pool has index_k_scale_buffer"
            )
        if index_k_scale is not None and scale_buf is not None:
            scales = self._check_rows("index_k_scale", index_k_scale, loc.numel(), 1, torch.float32)
            self._rows(scale_buf, slot).index_copy_(0, loc, scales.to(self.device))
        self._rows(self.index_k_buffer, slot).index_copy_(0, loc, byte_view(keys.to(self.device)))

    def get_index_k_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Copies of the indexer keys (and scales, or None) at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        slot = self._indexer_row(layer_id)
        assert self.index_k_buffer is not None
        keys = self._rows(self.index_k_buffer, slot).index_select(0, loc).view(self.dtype)
        scale_buf = self.index_k_scale_buffer
        scales = None if scale_buf is None else self._rows(scale_buf, slot).index_select(0, loc)
        return keys, scales
