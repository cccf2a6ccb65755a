"""Host pools that keep one ``kv_cache_dim`` row per (token, layer).

Layouts (docs/design.md section 5):

* ``layer_first``        ``(layer_num, size, 1, kv_cache_dim)``
* ``page_first``         ``(size, layer_num, 1, kv_cache_dim)``
* ``page_first_direct``  ``(page_num, layer_num, page_size, 1, kv_cache_dim)``

Its ``direct`` io backend (``RowDirectMover``) runs with any device pool that
has a per-layer ``kv_buffer`` list; device backends subclass it to add movers.
Flat L3 pages are in the layout's own byte order: ``(layer, token)`` for
``layer_first``, ``(token, layer)`` for ``page_first`` and
``(layer, token)`` for ``page_first_direct``.

A device pool with an indexer cache gets host mirrors of its components in
the same layout (``sgl_core._indexer_host``); a flat page is then the KV
part followed by the ``index_k`` and ``index_k_scale`` parts, each in the
layout's byte order, and is a ``torch.uint8`` byte tensor when the float32
scale part makes it mixed-dtype (``flat_page_dtype``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from sgl_core._device_pool import device_layers
from sgl_core._enums import HostLayout, IOBackend
from sgl_core._host_pool import MLAHostPoolBase
from sgl_core._indexer import IndexerConfig, indexer_of
from sgl_core._indexer_host import (
    IndexerMover,
    check_device_indexer,
    device_indexer_rows,
    host_shape,
)
from sgl_core._memory import page_aligned_zeros
from sgl_core._paged_indexer import (
    ForeignPagedIndexerPool,
    PagedFormat,
    PagedIndexerPart,
    paged_buffers,
)
from sgl_core._protocols import MLADevicePool
from sgl_core._row_mover import RowComponent, RowDirectMover
from sgl_core._transfer import Mover, MoverFactory
from sgl_core._validation import check_backed, check_layer_id
from sgl_core.errors import PoolMismatchError

__all__ = ["TokenRowHostPool"]

_INDEXER_NAMES = ("index_k_buffer", "index_k_scale_buffer")


class TokenRowHostPool(MLAHostPoolBase):
    """``layer_first`` / ``page_first`` / ``page_first_direct`` host pool."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        HostLayout.LAYER_FIRST: {IOBackend.DIRECT: RowDirectMover},
        HostLayout.PAGE_FIRST: {IOBackend.DIRECT: RowDirectMover},
        HostLayout.PAGE_FIRST_DIRECT: {IOBackend.DIRECT: RowDirectMover},
    }

    kv_buffer: torch.Tensor
    # Set only when the device pool has an indexer cache, so a pool without
    # one keeps the page format (l3._format) it always had.
    index_k_buffer: torch.Tensor
    index_k_scale_buffer: torch.Tensor | None
    indexer_layer_ids: tuple[int, ...]
    flat_page_dtype: torch.dtype

    # ----------------------------------------------------------------- hooks
    def _configure(self, device_pool: MLADevicePool) -> None:
        self._indexer: IndexerConfig | None = indexer_of(device_pool)
        # An engine's indexer kept in pages (SGLang's DSA pool): mirrored in our layout.
        self._paged: PagedFormat | None = None
        if isinstance(device_pool, ForeignPagedIndexerPool):
            self._paged = device_pool.paged_format

    def _bytes_per_token(self, device_pool: MLADevicePool) -> int:
        extra = 0 if self._indexer is None else self._indexer.bytes_per_token(self.shape.itemsize)
        return self.shape.layout_dim + extra

    def _allocate_buffers(self, device_pool: MLADevicePool) -> None:
        def zeros(rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
            shape = host_shape(self.layout, rows, self.size, self.page_size, dim)
            return page_aligned_zeros(shape, dtype, pin_memory=self.pin_memory)

        self.kv_buffer = zeros(self.layer_num, self.kv_cache_dim, self.dtype)
        #: Host buffers in flat-page order with their rows per token.
        self._parts: list[tuple[torch.Tensor, int]] = [(self.kv_buffer, self.layer_num)]
        cfg = self._indexer
        if cfg is not None:
            n = len(cfg.layer_ids)
            self.indexer_layer_ids = cfg.layer_ids
            self.index_k_buffer = zeros(n, cfg.index_head_dim, self.dtype)
            self._parts.append((self.index_k_buffer, n))
            self.index_k_scale_buffer = None
            if cfg.with_scale:
                self.index_k_scale_buffer = zeros(n, 1, torch.float32)
                self._parts.append((self.index_k_scale_buffer, n))
            self.flat_page_dtype = torch.uint8 if cfg.with_scale else self.dtype

    def _make_mover(self, factory: MoverFactory) -> Mover:
        kv = factory(self)
        cfg = self._indexer
        if cfg is None:
            return kv
        if self._paged is not None:
            paged = [
                PagedIndexerPart(buf, self.layout, cfg, scales=i == 1)
                for i, (buf, _) in enumerate(self._parts[1:])
            ]
            return IndexerMover(kv, paged, cfg)
        parts = [
            RowDirectMover(self, RowComponent(buf, rows, device_indexer_rows(name)))
            for (buf, rows), name in zip(self._parts[1:], _INDEXER_NAMES, strict=False)
        ]
        return IndexerMover(kv, parts, cfg)

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return self.layout is HostLayout.PAGE_FIRST_DIRECT

    def _device_pool_fingerprint(self, device_pool: MLADevicePool) -> tuple[object, ...]:
        # kv_buffer is a plain list: a replaced layer tensor must be re-validated.
        # So are the indexer lists (not validated here: this runs on every load).
        extra: list[object] = []
        if isinstance(device_pool, ForeignPagedIndexerPool):
            extra += device_pool.index_buffers()
        elif self._indexer is not None:
            for name in ("index_k_buffer", "index_k_scale_buffer"):
                tensors = getattr(device_pool, name, None)
                extra += tensors if isinstance(tensors, list) else [tensors]
        return (device_pool, *device_layers(device_pool), *extra)

    def _device_indexer(self, device_pool: MLADevicePool) -> list[torch.Tensor]:
        if self._paged is not None:
            return paged_buffers(device_pool, self._paged)
        return check_device_indexer(device_pool, self._indexer, self.dtype)

    def _check_device_pool_kind(self, device_pool: MLADevicePool) -> None:
        expected = (device_pool.size + device_pool.page_size, 1, self.kv_cache_dim)
        for i, layer in enumerate(device_layers(device_pool)):
            if not isinstance(layer, torch.Tensor):
                raise PoolMismatchError(f"device_pool.kv_buffer[{i}] is not a torch.Tensor")
            if tuple(layer.shape) != expected or layer.dtype != self.dtype:
                raise PoolMismatchError(
                    f"device_pool.kv_buffer[{i}] has shape {tuple(layer.shape)} "
                    f"{layer.dtype}, expected {expected} {self.dtype}"
                )
            check_backed(layer, f"device_pool.kv_buffer[{i}]")
        self._device_indexer(device_pool)

    def _layer_storage(self, device_pool: MLADevicePool, layer_id: int) -> Sequence[torch.Tensor]:
        layer = device_layers(device_pool)[layer_id]
        slot = None if self._indexer is None else self._indexer.slot(layer_id)
        if slot is None:
            return (layer,)
        if isinstance(device_pool, ForeignPagedIndexerPool):
            return (layer, device_pool.index_buffers()[slot])
        parts = [getattr(device_pool, "index_k_buffer", None)]
        if self._indexer is not None and self._indexer.with_scale:
            parts.append(getattr(device_pool, "index_k_scale_buffer", None))
        # Validation checked these lists; a replaced item is compared by signature.
        return (layer, *[p[slot] for p in parts if isinstance(p, list)])

    # ------------------------------------------------------------ host views
    def layer_views(
        self, device_pool: MLADevicePool, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(device_rows (slots, dim), host_pages (pages, page_size, dim))]`` per component.

        The KV row, then the layer's indexer keys and scales when it has an indexer slot.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        self.check_device_pool(device_pool)
        if self._paged is not None:
            raise PoolMismatchError("an indexer kept in engine pages has no token-row views")
        pairs = [(device_layers(device_pool)[layer_id], self.kv_buffer, layer_id)]
        slot = None if self._indexer is None else self._indexer.slot(layer_id)
        if slot is not None:
            for name, (buf, _) in zip(_INDEXER_NAMES, self._parts[1:], strict=False):
                pairs.append((getattr(device_pool, name)[slot], buf, slot))
        views = []
        for dev, buf, row in pairs:
            if self.layout is HostLayout.LAYER_FIRST:
                host = buf[row, :, 0].view(self.page_num, self.page_size, -1)
            elif self.layout is HostLayout.PAGE_FIRST:
                host = buf[:, row, 0].view(self.page_num, self.page_size, -1)
            else:
                host = buf[:, row, :, 0]
            views.append((dev.view(dev.shape[0], -1), host))
        return views

    def host_rows(self, layer_id: int, buffer: torch.Tensor | None = None) -> torch.Tensor | None:
        """``(size, 1, kv_cache_dim)`` token rows of one layer, or None (page-first-direct).

        ``buffer`` is ``kv_buffer`` itself (default) or a dtype view of it.
        """
        buf = self.kv_buffer if buffer is None else buffer
        if self.layout is HostLayout.LAYER_FIRST:
            return buf[layer_id]
        if self.layout is HostLayout.PAGE_FIRST:
            return buf[:, layer_id]
        if self.page_size == 1:
            return buf[:, layer_id, 0]
        return None

    # -------------------------------------------------------------- L3 pages
    def _flat_dtype(self) -> torch.dtype:
        return getattr(self, "flat_page_dtype", self.dtype)

    def _page_part(self, buffer: torch.Tensor, index: int) -> torch.Tensor:
        ps = self.page_size
        if self.layout is HostLayout.LAYER_FIRST:
            return buffer[:, index : index + ps]
        if self.layout is HostLayout.PAGE_FIRST:
            return buffer[index : index + ps]
        return buffer[index // ps]

    def _part_bytes(self) -> list[int]:
        """Bytes of each part of one page, in flat-page order."""
        return [
            self.page_size * rows * buf.shape[-1] * buf.element_size() for buf, rows in self._parts
        ]

    @property
    def flat_page_numel(self) -> int:
        itemsize = torch.empty((), dtype=self._flat_dtype()).element_size()
        return sum(self._part_bytes()) // itemsize

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of the page at token ``index``; 1-D (also when not ``flat``) with an indexer."""
        self.synchronize()  # transfers may still be queued on a stream
        start = self._check_page_start(index)
        if len(self._parts) == 1:
            page = self._page_part(self.kv_buffer, start)
            return page.flatten().clone() if flat else page.clone()
        flat_dtype = self._flat_dtype()
        parts = [self._page_part(b, start).contiguous().view(-1) for b, _ in self._parts]
        return torch.cat([p.view(torch.uint8) if flat_dtype == torch.uint8 else p for p in parts])

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.synchronize()
        start = self._check_page_start(index)
        self._check_flat_page(data_page, self.flat_page_numel, self._flat_dtype())
        flat = data_page.reshape(-1).contiguous().view(torch.uint8)
        offset = 0
        for (buffer, _), nbytes in zip(self._parts, self._part_bytes(), strict=True):
            page = self._page_part(buffer, start)
            part = flat[offset : offset + nbytes].clone()  # aligned for the dtype view
            offset += nbytes
            page.copy_(part.view(buffer.dtype).reshape(page.shape))

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(
            self.flat_page_numel, dtype=self._flat_dtype(), pin_memory=self.pin_memory
        )

    def _objects(self, buffer: torch.Tensor, rows: int, start: int) -> list[tuple[int, int]]:
        """``(address, bytes)`` of one part's memory objects of the page at ``start``."""
        row = buffer.shape[-1] * buffer.element_size()
        base = buffer.data_ptr()
        if self.layout is HostLayout.LAYER_FIRST:
            page = self.page_size * row
            return [(base + (r * self.size + start) * row, page) for r in range(rows)]
        # Both page-first layouts keep a page's rows contiguous at start * rows * row.
        return [(base + start * rows * row, self.page_size * rows * row)]

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        starts = self._page_starts(indices)
        self.synchronize()  # the caller reads these bytes by address
        objects = [o for s in starts for b, rows in self._parts for o in self._objects(b, rows, s)]
        return [p for p, _ in objects], [n for _, n in objects]

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        bases, totals, sizes = [], [], []
        for buffer, rows in self._parts:
            bases.append(buffer.data_ptr())
            totals.append(buffer.numel() * buffer.element_size())
            sizes.append(self._objects(buffer, rows, 0)[0][1])
        return bases, totals, sizes
