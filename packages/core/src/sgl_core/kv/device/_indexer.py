"""The sparse-attention (DSA/NSA) indexer cache of per-layer MLA device pools.

Buffers, slots and what a host pool mirrors: docs/design.md section 5a
(DeepSeek-V3.2 rows). :class:`IndexerConfig` is that mirrored configuration
(``PoolMismatchError`` when a device pool's differs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from sgl_core.errors import LayerIndexError, PoolMismatchError, PoolSizeError
from sgl_core.kv._spec import KVSpec, MLAShape, mla_spec, positive_int
from sgl_core.kv._validation import check_layer_id, check_value_rows
from sgl_core.kv.device._slot_geometry import SlotGeometry
from sgl_core.transfer.copy._copy import byte_view

__all__ = ["IndexerConfig", "IndexerRows", "check_indexer", "indexer_of", "mla_pool_spec"]

#: Bytes of one index_k scale (float32).
SCALE_BYTES = 4


@dataclasses.dataclass(frozen=True)
class IndexerConfig:
    """``index_head_dim``, the model layers that have an indexer row, whether it has scales."""

    index_head_dim: int
    layer_ids: tuple[int, ...]
    with_scale: bool

    def slot(self, layer_id: int) -> int | None:
        """Row of ``layer_id`` in the indexer buffers, None when the layer has none."""
        try:
            return self.layer_ids.index(layer_id)
        except ValueError:
            return None

    def bytes_per_token(self, itemsize: int) -> int:
        """Bytes one token costs over every indexer layer (keys and scales)."""
        row = self.index_head_dim * itemsize + (SCALE_BYTES if self.with_scale else 0)
        return len(self.layer_ids) * row


def check_indexer(
    index_head_dim: int | None,
    indexer_layer_ids: Iterable[int] | None,
    with_index_k_scale: bool,
    layer_num: int,
) -> IndexerConfig | None:
    """The validated configuration (None: no indexer), or ``PoolSizeError``/``LayerIndexError``."""
    if not isinstance(with_index_k_scale, bool):
        raise PoolSizeError(f"with_index_k_scale must be a bool, got {with_index_k_scale!r}")
    if index_head_dim is None:
        if indexer_layer_ids is not None or with_index_k_scale:
            raise PoolSizeError(
                "indexer_layer_ids / with_index_k_scale need index_head_dim to be set"
            )
        return None
    positive_int("index_head_dim", index_head_dim)
    ids = list(range(layer_num)) if indexer_layer_ids is None else list(indexer_layer_ids)
    for layer in ids:
        try:
            check_layer_id(layer, layer_num)
        except LayerIndexError as exc:
            raise LayerIndexError(f"indexer_layer_ids: {exc}") from None
    if len(set(ids)) != len(ids) or not ids:
        raise PoolSizeError(f"indexer_layer_ids must be distinct and non-empty, got {ids}")
    return IndexerConfig(index_head_dim, tuple(sorted(ids)), with_index_k_scale)


def indexer_of(pool: object) -> IndexerConfig | None:
    """A device pool's indexer configuration from its public attributes (None: none).

    Only pools that declare the whole configuration (``IndexerCache``) count:
    an engine's own pool with just an ``index_head_dim`` attribute is mirrored
    without it (SGLang's DSA pools are seen through a view that declares theirs,
    ``sgl_core.kv.device._paged_indexer``).
    """
    head_dim = getattr(pool, "index_head_dim", None)
    ids = getattr(pool, "indexer_layer_ids", None)
    if not isinstance(head_dim, int) or not isinstance(ids, tuple) or not ids:
        return None
    return IndexerConfig(head_dim, ids, bool(getattr(pool, "has_index_k_scale", False)))


def mla_pool_spec(shape: MLAShape, indexer: IndexerConfig | None) -> KVSpec:
    """An MLA pool's spec: ``shape``'s rows, plus the indexer's rows when it has one."""
    if indexer is None:
        return shape.spec
    return mla_spec(
        shape.layer_num,
        shape.kv_lora_rank,
        shape.qk_rope_head_dim,
        shape.dtype,
        shape.row_dim,
        index_head_dim=indexer.index_head_dim,
        indexer_layer_ids=indexer.layer_ids,
        with_index_k_scale=indexer.with_scale,
    )


class IndexerRows(SlotGeometry):
    """The DSA indexer accessors of an MLA device pool, read off its spec's ``index_k`` rows.

    A base of ``PerLayerMLADevicePool`` (buffers: a list of per-slot tensors)
    and of the Ascend MLA pool (one tensor per component, slots first), which
    overrides :meth:`_rows`, the ``(slots, 1, dim)`` view of one slot's rows.
    """

    index_k_buffer: Any
    index_k_scale_buffer: Any

    if TYPE_CHECKING:  # the pool's (an attribute; read-only here, so a narrower spec fits)

        @property
        def spec(self) -> KVSpec: ...

    def _rows(self, buffer: Any, row: int) -> torch.Tensor:
        """Row ``row`` (an indexer slot) of ``buffer``, fp8 as bytes."""
        return byte_view(buffer[row])

    @property
    def index_head_dim(self) -> int | None:
        return self.spec.component("index_k").dim if self.spec.has("index_k") else None

    @property
    def indexer_layer_ids(self) -> tuple[int, ...]:
        """Model layers that have an indexer cache, ascending (empty: no indexer)."""
        keys = self.spec.component("index_k").layers if self.spec.has("index_k") else None
        return () if keys is None else keys

    @property
    def has_index_k_scale(self) -> bool:
        return self.spec.has("index_k_scale")

    def indexer_slot(self, layer_id: int) -> int | None:
        """Row of ``layer_id`` in the indexer buffers, or None if it has no indexer."""
        layer_id = check_layer_id(layer_id, self.layer_num)
        return self.spec.component("index_k").slot(layer_id) if self.spec.has("index_k") else None

    def _indexer_row(self, layer_id: int) -> int:
        slot = self.indexer_slot(layer_id)
        if slot is None or self.index_k_buffer is None:
            raise LayerIndexError(
                f"layer_id={layer_id} has no indexer cache "
                f"(indexer_layer_ids={list(self.indexer_layer_ids)})"
            )
        return slot

    def set_index_k_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        index_k: torch.Tensor,
        index_k_scale: torch.Tensor | None = None,
    ) -> None:
        """Write ``(n, 1, index_head_dim)`` indexer keys (and ``(n, 1, 1)`` fp32 scales).

        Everything is checked before a byte is written; values are never converted.
        """
        loc = self._check_loc(layer_id, loc)
        slot = self._indexer_row(layer_id)
        n, dim = loc.numel(), self.spec.component("index_k").dim
        keys = check_value_rows(index_k, "index_k", (n, 1, dim), self.dtype)
        scale_buf = self.index_k_scale_buffer
        if (index_k_scale is None) != (scale_buf is None):
            raise PoolMismatchError(
                "index_k_scale must be given exactly when the pool has index_k_scale_buffer"
            )
        if index_k_scale is not None and scale_buf is not None:
            scales = check_value_rows(index_k_scale, "index_k_scale", (n, 1, 1), torch.float32)
            self._rows(scale_buf, slot).index_copy_(0, loc, scales.to(self.device).contiguous())
        rows = byte_view(keys.to(self.device).contiguous())
        self._rows(self.index_k_buffer, slot).index_copy_(0, loc, rows)

    def get_index_k_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Copies of the indexer keys (and scales, or None) at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        slot = self._indexer_row(layer_id)
        keys = self._rows(self.index_k_buffer, slot).index_select(0, loc).view(self.dtype)
        scale_buf = self.index_k_scale_buffer
        return keys, None if scale_buf is None else self._rows(scale_buf, slot).index_select(0, loc)
