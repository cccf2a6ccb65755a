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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from sgl_core._device_pool import device_layers
from sgl_core._enums import HostLayout, IOBackend
from sgl_core._host_pool import MLAHostPoolBase
from sgl_core._memory import page_aligned_zeros
from sgl_core._protocols import MLADevicePool
from sgl_core._row_mover import RowDirectMover
from sgl_core._transfer import MoverFactory
from sgl_core._validation import check_backed, check_layer_id
from sgl_core.errors import PoolMismatchError

__all__ = ["TokenRowHostPool"]


class TokenRowHostPool(MLAHostPoolBase):
    """``layer_first`` / ``page_first`` / ``page_first_direct`` host pool."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        HostLayout.LAYER_FIRST: {IOBackend.DIRECT: RowDirectMover},
        HostLayout.PAGE_FIRST: {IOBackend.DIRECT: RowDirectMover},
        HostLayout.PAGE_FIRST_DIRECT: {IOBackend.DIRECT: RowDirectMover},
    }

    kv_buffer: torch.Tensor

    def _allocate_buffers(self, device_pool: MLADevicePool) -> None:
        dims = (1, self.kv_cache_dim)
        shapes = {
            HostLayout.LAYER_FIRST: (self.layer_num, self.size, *dims),
            HostLayout.PAGE_FIRST: (self.size, self.layer_num, *dims),
            HostLayout.PAGE_FIRST_DIRECT: (self.page_num, self.layer_num, self.page_size, *dims),
        }
        self.kv_buffer = page_aligned_zeros(
            shapes[self.layout], self.dtype, pin_memory=self.pin_memory
        )

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return self.layout is HostLayout.PAGE_FIRST_DIRECT

    def _device_pool_fingerprint(self, device_pool: MLADevicePool) -> tuple[object, ...]:
        # kv_buffer is a plain list: a replaced layer tensor must be re-validated.
        return (device_pool, *device_layers(device_pool))

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

    def _layer_storage(self, device_pool: MLADevicePool, layer_id: int) -> Sequence[torch.Tensor]:
        return (device_layers(device_pool)[layer_id],)

    # ------------------------------------------------------------ host views
    def layer_views(
        self, device_pool: MLADevicePool, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(device_rows (slots, dim), host_pages (pages, page_size, dim))]``, one component."""
        layer_id = check_layer_id(layer_id, self.layer_num)
        self.check_device_pool(device_pool)
        dev = device_layers(device_pool)[layer_id]
        buf, ps = self.kv_buffer, self.page_size
        if self.layout is HostLayout.LAYER_FIRST:
            host = buf[layer_id, :, 0].view(self.page_num, ps, -1)
        elif self.layout is HostLayout.PAGE_FIRST:
            host = buf[:, layer_id, 0].view(self.page_num, ps, -1)
        else:
            host = buf[:, layer_id, :, 0]
        return [(dev.view(dev.shape[0], -1), host)]

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
    def _page_view(self, index: int) -> torch.Tensor:
        ps = self.page_size
        if self.layout is HostLayout.LAYER_FIRST:
            return self.kv_buffer[:, index : index + ps]
        if self.layout is HostLayout.PAGE_FIRST:
            return self.kv_buffer[index : index + ps]
        return self.kv_buffer[index // ps]

    @property
    def flat_page_numel(self) -> int:
        return self.page_size * self.layer_num * self.kv_cache_dim

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        self.synchronize()  # transfers may still be queued on a stream
        page = self._page_view(self._check_page_start(index))
        return page.flatten().clone() if flat else page.clone()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.synchronize()
        page = self._page_view(self._check_page_start(index))
        self._check_flat_page(data_page, self.flat_page_numel)
        page.copy_(data_page.reshape(page.shape))

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.flat_page_numel, dtype=self.dtype, pin_memory=self.pin_memory)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        starts = self._page_starts(indices)
        self.synchronize()  # the caller reads these bytes by address
        base = self.kv_buffer.data_ptr()
        row = self.shape.token_stride_size
        page_bytes = self.page_size * row
        if self.layout is HostLayout.LAYER_FIRST:
            layer_stride = self.size * row
            ptrs = [
                base + layer * layer_stride + s * row
                for s in starts
                for layer in range(self.layer_num)
            ]
            return ptrs, [page_bytes] * len(ptrs)
        all_layers = page_bytes * self.layer_num
        # Both page-first layouts keep a page's layers contiguous at start*layout_dim.
        return [base + s * self.shape.layout_dim for s in starts], [all_layers] * len(starts)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        page_bytes = self.page_size * self.shape.token_stride_size
        obj = page_bytes if self.layout is HostLayout.LAYER_FIRST else page_bytes * self.layer_num
        nbytes = self.kv_buffer.numel() * self.kv_buffer.element_size()
        return [self.kv_buffer.data_ptr()], [nbytes], [obj]
