"""The token-row host pool: one buffer per KV component, in a layout of ``sgl_core.kv._layouts``
(docs/design.md section 5, "One host pool, one mover per io").

Its ``direct`` io backend runs with any device pool that lists per-layer
tensors of each component; device backends subclass it to add movers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from sgl_core.errors import PoolMismatchError
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._layouts import layout_facts
from sgl_core.kv._memory import page_aligned_zeros
from sgl_core.kv._spec import Component, MHAShape, MLAShape
from sgl_core.kv._validation import check_backed, check_layer_id
from sgl_core.kv.device._indexer import IndexerConfig, indexer_of
from sgl_core.kv.device._paged_indexer import (
    ForeignPagedIndexerPool,
    PagedFormat,
    PagedIndexerPart,
    paged_buffers,
)
from sgl_core.kv.host._host_kinds import MHAHostPoolBase, MLAHostPoolBase
from sgl_core.kv.host._host_pages import TokenPages
from sgl_core.kv.host._host_pool import DevT, ShapeT
from sgl_core.kv.host._indexer_host import IndexerMover, check_device_indexer
from sgl_core.kv.protocols._kv_protocols import MHADevicePool, MLADevicePool
from sgl_core.transfer._direct_mover import DirectMover
from sgl_core.transfer._transfer import HostPart, HostSide, Mover, MoverFactory

__all__ = ["MHATokenHostPool", "TokenHostPool", "TokenRowHostPool"]

_DIRECT: Mapping[IOBackend, MoverFactory] = {IOBackend.DIRECT: DirectMover}
_TOKEN_ROWS = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT)


class TokenHostPool(TokenPages[DevT, ShapeT]):
    """A host pool of token-row layouts over the spec's components (any kind)."""

    #: MLA: the ``kv`` rows; MHA: K and V stacked, or None (unequal head dims).
    kv_buffer: torch.Tensor | None
    # Set only when the spec has indexer rows (declared, not class attributes).
    index_k_scale_buffer: torch.Tensor | None
    indexer_layer_ids: tuple[int, ...] | None
    flat_page_dtype: torch.dtype

    # ----------------------------------------------------------------- hooks
    def _configure(self, device_pool: DevT) -> None:
        self._indexer: IndexerConfig | None = indexer_of(device_pool)
        # An engine's indexer kept in pages (SGLang's DSA pool): mirrored in our layout.
        self._paged: PagedFormat | None = None
        if isinstance(device_pool, ForeignPagedIndexerPool):
            self._paged = device_pool.paged_format

    def _allocate_buffers(self, device_pool: DevT) -> None:
        self._facts = facts = layout_facts(self.layout)
        spec, size, ps, pin = self.spec, self.size, self.page_size, self.pin_memory

        def shape(c: Component) -> tuple[int, ...]:
            return facts.shape(c.rows(spec.layer_num), size, ps, c.heads, c.dim)

        buffers: dict[str, torch.Tensor] = {}
        stack = [spec.component(name) for name in spec.stacked]
        if stack:
            self.kv_buffer = None
            if len({(shape(c), c.dtype) for c in stack}) == 1:
                self.kv_buffer = page_aligned_zeros(
                    (len(stack), *shape(stack[0])), stack[0].dtype, pin_memory=pin
                )
                buffers.update((c.name, self.kv_buffer[i]) for i, c in enumerate(stack))
        for c in spec.components:
            if c.name not in buffers:
                buffers[c.name] = page_aligned_zeros(shape(c), c.dtype, pin_memory=pin)
            setattr(self, c.device_name, buffers[c.name])
        #: Host buffers in spec (flat-page) order.
        self._parts = tuple(HostPart(c, buffers[c.name]) for c in spec.components)
        if spec.has("index_k"):
            # Set only with an indexer, so a pool without one keeps its page format (l3).
            self.indexer_layer_ids = spec.component("index_k").layers
            self.flat_page_dtype = spec.flat_page_dtype
            if not spec.has("index_k_scale"):
                self.index_k_scale_buffer = None

    def _mover_of(self, factory: Callable[[HostSide], Mover[Any]], side: HostSide) -> Mover[Any]:
        """One io backend's mover from its factory (a hook for backends' own arguments)."""
        return factory(side)

    def _make_mover(self, factory: Callable[[HostSide], Mover[Any]]) -> Mover[Any]:
        side = self.host_side
        rows = tuple(p for p in side.parts if p.component.layers is None)
        subset = [p for p in side.parts if p.component.layers is not None]
        direct = isinstance(factory, type) and issubclass(factory, DirectMover)
        if not subset or (direct and self._paged is None):
            # A direct mover moves every component itself, layer subsets included.
            return self._mover_of(factory, side)
        kv = self._mover_of(factory, dataclasses.replace(side, parts=rows))
        cfg = self._indexer
        if cfg is None:
            return kv
        if self._paged is not None:
            paged = [
                PagedIndexerPart(p.buffer, self.layout, cfg, scales=i == 1)
                for i, p in enumerate(subset)
            ]
            return IndexerMover(kv, paged, cfg.slot)
        # The indexer rows move by the core direct engine whatever the KV io is.
        return IndexerMover(kv, [DirectMover(side, subset)], None)

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return self._facts.paged

    def _device_list(self, device_pool: DevT, c: Component) -> list[torch.Tensor]:
        tensors = getattr(device_pool, c.device_name, None)
        if not isinstance(tensors, list) or len(tensors) != c.rows(self.layer_num):
            rows = [r.device_name for r in self.spec.components if r.layers is None]
            raise PoolMismatchError(
                f"{type(device_pool).__name__} has no per-layer {'/'.join(rows)} "
                f"list{'s' if len(rows) > 1 else ''}; this host pool needs a per-layer "
                "device pool (torch or cuda backend)"
            )
        return tensors

    def _row_lists(self, device_pool: DevT) -> list[tuple[Component, list[torch.Tensor]]]:
        """Each every-layer component and its device pool's per-layer tensors."""
        return [
            (c, self._device_list(device_pool, c)) for c in self.spec.components if c.layers is None
        ]

    def _device_pool_fingerprint(self, device_pool: DevT) -> tuple[object, ...]:
        # The lists are plain lists: a replaced layer tensor must be re-validated.
        # So are the indexer lists (not validated here: this runs on every load).
        paged = isinstance(device_pool, ForeignPagedIndexerPool)
        extra: list[object] = []
        for c in self.spec.components:
            if not (paged and c.layers is not None):  # unchecked: validation says what is wrong
                tensors = getattr(device_pool, c.device_name, None)
                extra += tensors if isinstance(tensors, list) else [tensors]
        if isinstance(device_pool, ForeignPagedIndexerPool):  # its indexer lives in pages
            extra += device_pool.index_buffers()
        return (device_pool, *extra)

    def _check_device_pool_kind(self, device_pool: DevT) -> None:
        slots = device_pool.size + device_pool.page_size
        for c, layers in self._row_lists(device_pool):
            expected = (slots, c.heads, c.dim)
            for i, layer in enumerate(layers):
                name = f"device_pool.{c.device_name}[{i}]"
                if not isinstance(layer, torch.Tensor):
                    raise PoolMismatchError(f"{name} is not a torch.Tensor")
                if tuple(layer.shape) != expected or layer.dtype != c.dtype:
                    raise PoolMismatchError(
                        f"{name} has shape {tuple(layer.shape)} {layer.dtype}, "
                        f"expected {expected} {c.dtype}"
                    )
                check_backed(layer, name)
        if self._paged is not None:
            paged_buffers(device_pool, self._paged)
        else:
            check_device_indexer(device_pool, self._indexer, self.dtype)

    def _layer_storage(self, device_pool: DevT, layer_id: int) -> Sequence[torch.Tensor]:
        found = [ts[layer_id] for _, ts in self._row_lists(device_pool)]
        slot = None if self._indexer is None else self._indexer.slot(layer_id)
        if slot is None:
            return found
        if isinstance(device_pool, ForeignPagedIndexerPool):
            return (*found, device_pool.index_buffers()[slot])
        for c in self.spec.components:
            tensors = getattr(device_pool, c.device_name, None) if c.layers is not None else None
            # Validation checked these lists; a replaced item is compared by signature.
            if isinstance(tensors, list):
                found.append(tensors[slot])
        return found

    # ------------------------------------------------------------ host views
    def layer_views(
        self, device_pool: DevT, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(device_rows (slots, dim), host_pages (pages, page_size, dim))]`` per component.

        The components of layer ``layer_id`` in spec order (an indexer's only
        where the layer has a slot); ``page_head`` keeps heads outside tokens,
        so there it is one pair per (component, head) with ``dim = head_dim``.
        All are views of the pools' memory.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        self.check_device_pool(device_pool)
        if self._paged is not None:
            raise PoolMismatchError("an indexer kept in engine pages has no token-row views")
        views: list[tuple[torch.Tensor, torch.Tensor]] = []
        for part in self._parts:
            r = part.component.slot(layer_id)
            if r is None:
                continue
            dev = getattr(device_pool, part.component.device_name)[r]
            host = self._facts.row(part.buffer, r)
            if not self._facts.heads_inner:
                views += [(dev[:, h], host[:, h]) for h in range(part.component.heads)]
                continue
            views.append((dev.view(dev.shape[0], -1), host.view(self.page_num, self.page_size, -1)))
        return views


class TokenRowHostPool(TokenHostPool[MLADevicePool, MLAShape], MLAHostPoolBase):
    """``layer_first`` / ``page_first`` / ``page_first_direct`` MLA host pool."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        layout: _DIRECT for layout in _TOKEN_ROWS
    }

    kv_buffer: torch.Tensor
    # Set only when the device pool has an indexer cache.
    index_k_buffer: torch.Tensor

    def host_rows(self, layer_id: int, buffer: torch.Tensor | None = None) -> torch.Tensor | None:
        """``(size, 1, kv_cache_dim)`` token rows of one layer, or None (page-first-direct).

        ``buffer`` is ``kv_buffer`` itself (default) or a dtype view of it.
        """
        buf = self.kv_buffer if buffer is None else buffer
        if not self._facts.paged:
            return self._facts.row(buf, layer_id)
        return buf[:, layer_id, 0] if self.page_size == 1 else None


class MHATokenHostPool(TokenHostPool[MHADevicePool, MHAShape], MHAHostPoolBase):
    """``layer_first`` / ``page_first`` / ``page_first_direct`` / ``page_head`` MHA host pool."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        layout: _DIRECT for layout in (*_TOKEN_ROWS, HostLayout.PAGE_HEAD)
    }

    #: ``(2, ...)``: K and V in one allocation (``head_dim == v_head_dim``), else None.
    kv_buffer: torch.Tensor | None
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor


if TYPE_CHECKING:
    from sgl_core.kv.device._device_pool import PerLayerMHADevicePool
    from sgl_core.kv.protocols._kv_protocols import MHAHostPool

    _host: MHAHostPool = MHATokenHostPool(
        PerLayerMHADevicePool(
            size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
        ),
        layout="page_head",
    )
