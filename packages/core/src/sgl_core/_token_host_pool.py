"""Host pools that keep one ``kv_cache_dim`` row per (token, layer).

Layouts (DESIGN §3):

* ``layer_first``        ``(layer_num, size, 1, kv_cache_dim)``
* ``page_first``         ``(size, layer_num, 1, kv_cache_dim)``
* ``page_first_direct``  ``(page_num, layer_num, page_size, 1, kv_cache_dim)``

This class implements the ``direct`` io backend for any device pool with a
per-layer ``kv_buffer`` list; device backends subclass it to add kernels.
Flat L3 pages are in the layout's own byte order: ``(layer, token)`` for
``layer_first``, ``(token, layer)`` for ``page_first`` and
``(layer, token)`` for ``page_first_direct``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from sgl_core._copy import IndexRuns, copy_blocks, merge_runs
from sgl_core._enums import HostLayout, IOBackend
from sgl_core._host_pool import MLAHostPoolBase
from sgl_core._protocols import MLADevicePool
from sgl_core.errors import PoolMismatchError

__all__ = ["TokenRowHostPool", "device_layers"]

# Runs shorter than this many bytes copy faster as one gather/scatter per layer.
_SHORT_RUN_BYTES = 16 << 10


def device_layers(device_pool: MLADevicePool) -> list[torch.Tensor]:
    """The per-layer ``kv_buffer`` list of a device pool, or ``PoolMismatchError``."""
    layers = getattr(device_pool, "kv_buffer", None)
    if not isinstance(layers, list) or len(layers) != device_pool.layer_num:
        raise PoolMismatchError(
            f"{type(device_pool).__name__} has no per-layer kv_buffer list; "
            "this host pool needs a per-layer device pool (torch or cuda backend)"
        )
    return layers


class TokenRowHostPool(MLAHostPoolBase):
    """``layer_first`` / ``page_first`` / ``page_first_direct`` host pool."""

    supported_pairs: ClassVar[Mapping[HostLayout, frozenset[IOBackend]]] = {
        HostLayout.LAYER_FIRST: frozenset({IOBackend.DIRECT}),
        HostLayout.PAGE_FIRST: frozenset({IOBackend.DIRECT}),
        HostLayout.PAGE_FIRST_DIRECT: frozenset({IOBackend.DIRECT}),
    }

    kv_buffer: torch.Tensor

    def _allocate_buffers(self, device_pool: MLADevicePool) -> None:
        dims = (1, self.kv_cache_dim)
        shapes = {
            HostLayout.LAYER_FIRST: (self.layer_num, self.size, *dims),
            HostLayout.PAGE_FIRST: (self.size, self.layer_num, *dims),
            HostLayout.PAGE_FIRST_DIRECT: (self.page_num, self.layer_num, self.page_size, *dims),
        }
        self.kv_buffer = torch.zeros(
            shapes[self.layout], dtype=self.dtype, pin_memory=self.pin_memory
        )

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return self.layout is HostLayout.PAGE_FIRST_DIRECT

    def _check_device_pool_kind(self, device_pool: MLADevicePool) -> None:
        expected = (device_pool.size + device_pool.page_size, 1, self.kv_cache_dim)
        for i, layer in enumerate(device_layers(device_pool)):
            if tuple(layer.shape) != expected or layer.dtype != self.dtype:
                raise PoolMismatchError(
                    f"device_pool.kv_buffer[{i}] has shape {tuple(layer.shape)} "
                    f"{layer.dtype}, expected {expected} {self.dtype}"
                )

    # ------------------------------------------------------------ host views
    def host_rows(self, layer_id: int) -> torch.Tensor | None:
        """``(size, 1, kv_cache_dim)`` rows of one layer, or None (page-first-direct)."""
        if self.layout is HostLayout.LAYER_FIRST:
            return self.kv_buffer[layer_id]
        if self.layout is HostLayout.PAGE_FIRST:
            return self.kv_buffer[:, layer_id]
        if self.page_size == 1:
            return self.kv_buffer[:, layer_id, 0]
        return None

    def host_run(self, layer_id: int, start: int, length: int) -> torch.Tensor:
        """View of host tokens ``[start, start+length)`` of one layer."""
        if self.layout is HostLayout.LAYER_FIRST:
            return self.kv_buffer[layer_id, start : start + length]
        if self.layout is HostLayout.PAGE_FIRST:
            return self.kv_buffer[start : start + length, layer_id]
        ps = self.page_size
        return self.kv_buffer[start // ps : (start + length) // ps, layer_id]

    # ------------------------------------------------------------- transfers
    def _runs(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> IndexRuns:
        if self._is_page_granular(IOBackend.DIRECT):
            ps = self.page_size
            return merge_runs(host_indices[::ps], device_indices[::ps], unit=ps)
        return merge_runs(host_indices, device_indices)

    def direct_copy(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layers: Sequence[int],
        *,
        to_host: bool,
    ) -> None:
        """Copy ``layers`` of the paired rows, merging runs into slice copies."""
        dev = device_layers(device_pool)
        runs = self._runs(host_indices, device_indices)
        run_bytes = self.shape.token_stride_size * host_indices.numel() // max(len(runs), 1)
        if run_bytes < _SHORT_RUN_BYTES and self.host_rows(0) is not None:
            self._gather_scatter(dev, host_indices, device_indices, layers, to_host=to_host)
            return
        host_blocks: list[torch.Tensor] = []
        dev_blocks: list[torch.Tensor] = []
        for layer in layers:
            dev_layer = dev[layer]
            for h, d, n in runs:
                block = self.host_run(layer, h, n)
                host_blocks.append(block)
                dev_blocks.append(dev_layer[d : d + n].view(block.shape))
        if to_host:
            self._copy(host_blocks, dev_blocks)
        else:
            self._copy(dev_blocks, host_blocks)

    @staticmethod
    def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        if dst[0].device == src[0].device:
            copy_blocks(dst, src)
            return
        for d, s in zip(dst, src, strict=True):
            d.copy_(s, non_blocking=True)

    def _gather_scatter(
        self,
        dev: list[torch.Tensor],
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layers: Sequence[int],
        *,
        to_host: bool,
    ) -> None:
        h_idx = host_indices.to("cpu")
        d_idx = device_indices.to(dev[0].device)
        for layer in layers:
            rows = self.host_rows(layer)
            assert rows is not None
            if to_host:
                rows.index_copy_(0, h_idx, dev[layer].index_select(0, d_idx).to("cpu"))
            else:
                dev[layer].index_copy_(0, d_idx, rows.index_select(0, h_idx).to(dev[layer].device))

    def _backup(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend,
    ) -> None:
        self.direct_copy(
            device_pool, host_indices, device_indices, range(self.layer_num), to_host=True
        )

    def _load(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: IOBackend,
    ) -> None:
        self.direct_copy(device_pool, host_indices, device_indices, [layer_id], to_host=False)

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
        page = self._page_view(self._check_page_start(index))
        return page.flatten().clone() if flat else page.clone()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self._page_view(self._check_page_start(index))
        self._check_flat_page(data_page, self.flat_page_numel)
        page.copy_(data_page.reshape(page.shape))

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.flat_page_numel, dtype=self.dtype, pin_memory=self.pin_memory)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        starts = self._page_starts(indices)
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
