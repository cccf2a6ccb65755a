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

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from sgl_core._copy import IndexRuns, copy_pairs, memmove_blocks, merge_runs, widen_rows
from sgl_core._enums import HostLayout, IOBackend
from sgl_core._host_pool import MLAHostPoolBase
from sgl_core._protocols import MLADevicePool
from sgl_core._validation import check_backed, check_layer_id
from sgl_core.errors import PoolMismatchError

__all__ = ["TokenRowHostPool", "device_layers", "stacked_layers"]

# Per-layer runs shorter than this many bytes copy faster as one gather/scatter
# per layer (measured on 2 CPU cores: index ops win up to page 64, 72 KB runs).
_SHORT_RUN_BYTES = 96 << 10
# All-layer strided copies beat per-layer gathers once a run of one layer is this big.
_STACKED_MIN_RUN_BYTES = 8 << 10
# Between CPU buffers, blocks of one layer at least this big copy faster by address
# (``memmove_blocks``) than by gather/scatter (2 cores, per-layer loads: equal at
# 18 KB, 0.64x vs 0.50x the contiguous copy at 36 KB, 0.87x vs 0.55x at 72 KB).
_MEMMOVE_MIN_BLOCK_BYTES = 32 << 10


@dataclasses.dataclass(frozen=True)
class _BlockLayout:
    host_offsets: list[int]
    dev_offsets: list[int]
    sizes: list[int]
    host_layer_step: int
    host_end: int  # one past the last host row a block touches
    dev_end: int


class _RowPlan:
    """A call's merged runs, and what per-layer loads of the same indices reuse."""

    __slots__ = ("blocks", "runs")

    def __init__(self, runs: IndexRuns) -> None:
        self.runs = runs
        self.blocks: _BlockLayout | None = None


def stacked_layers(layers: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``(layer_num, *layer.shape)`` view of layers that are equally spaced in one storage.

    None when the layers are separate allocations (or replaced, or strided):
    the caller then copies layer by layer.
    """
    first = layers[0]
    if len(layers) < 2 or not first.is_contiguous():
        return None
    item = first.element_size()
    step = layers[1].data_ptr() - first.data_ptr()
    if step < first.numel() * item or step % item:
        return None
    storage = first.untyped_storage().data_ptr()
    for i, layer in enumerate(layers):
        if (
            layer.data_ptr() != first.data_ptr() + i * step
            or layer.untyped_storage().data_ptr() != storage
            or layer.shape != first.shape
            or layer.dtype != first.dtype
            or not layer.is_contiguous()
        ):
            return None
    return first.as_strided((len(layers), *first.shape), (step // item, *first.stride()))


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

    # ------------------------------------------------------------- transfers
    def _plan(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> _RowPlan:
        cached = self._cached_plan()
        if isinstance(cached, _RowPlan):
            return cached
        if self._is_page_granular(IOBackend.DIRECT):
            ps = self.page_size
            runs = merge_runs(host_indices[::ps], device_indices[::ps], unit=ps)
        else:
            runs = merge_runs(host_indices, device_indices)
        plan = _RowPlan(runs)
        self._store_plan(plan)
        return plan

    def _block_layout(self, plan: _RowPlan) -> _BlockLayout:
        """Byte offsets of every block of one layer (host from the buffer, device from the layer).

        A run is one block, but in page_first_direct, where a run's pages are a
        layer stride apart on the host, each page is a block.
        """
        if plan.blocks is not None:
            return plan.blocks
        runs = plan.runs
        row = self.shape.token_stride_size
        host_starts = torch.tensor(runs.src_starts, dtype=torch.int64)
        dev_starts = torch.tensor(runs.dst_starts, dtype=torch.int64)
        lengths = torch.tensor(runs.lengths, dtype=torch.int64)
        if self.layout is HostLayout.PAGE_FIRST_DIRECT:
            ps = self.page_size
            pages = lengths // ps
            within = torch.arange(int(pages.sum())) - torch.repeat_interleave(
                torch.cumsum(pages, 0) - pages, pages
            )
            host_starts = torch.repeat_interleave(host_starts, pages) + within * ps
            dev_starts = torch.repeat_interleave(dev_starts, pages) + within * ps
            lengths = torch.full_like(host_starts, ps)
            # host rows are (page, layer, token in page): a page of one layer is ps rows
            host_offsets = host_starts * self.layer_num * row
            layer_step = ps * row
        else:
            host_offsets = host_starts * row
            layer_step = self.size * row
        plan.blocks = _BlockLayout(
            host_offsets=host_offsets.tolist(),
            dev_offsets=(dev_starts * row).tolist(),
            sizes=(lengths * row).tolist(),
            host_layer_step=layer_step,
            host_end=int((host_starts + lengths).max()),
            dev_end=int((dev_starts + lengths).max()),
        )
        return plan.blocks

    def _direct_copy(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layers: Sequence[int],
        *,
        to_host: bool,
    ) -> None:
        """Copy ``layers`` of the paired rows, merging runs into slice copies.

        When every layer is moved and the device layers are equally spaced
        views of one allocation, each run is a single strided copy across all
        layers (viewed as wide ints; ATen splits each such copy over its
        threads). Otherwise, between CPU buffers, blocks of at least
        ``_MEMMOVE_MIN_BLOCK_BYTES`` are copied by address; short runs go
        through one gather/scatter per layer; the rest are (layer, run) blocks
        in a batched ``_foreach_copy_`` (a page of one layer in its own dtype
        is big enough for ATen to copy with all cores).
        """
        all_layers = device_layers(device_pool)
        host_buf = widen_rows(self.kv_buffer)
        plan = self._plan(host_indices, device_indices)
        runs = plan.runs
        run_bytes = self.shape.token_stride_size * host_indices.numel() // max(len(runs), 1)
        # page_first_direct keeps a run's pages a layer stride apart: a page is a block
        block_bytes = (
            self.page_size * self.shape.token_stride_size
            if self.layout is HostLayout.PAGE_FIRST_DIRECT
            else run_bytes
        )
        stacked = stacked_layers(all_layers) if len(layers) == self.layer_num > 1 else None
        if stacked is not None and run_bytes >= _STACKED_MIN_RUN_BYTES:
            host_blocks, dev_blocks = self._all_layer_blocks(host_buf, widen_rows(stacked), runs)
        elif block_bytes >= _MEMMOVE_MIN_BLOCK_BYTES and self._addressable(all_layers, layers):
            self._memmove_copy(all_layers, layers, plan, to_host=to_host)
            return
        elif run_bytes < _SHORT_RUN_BYTES:
            dev = {layer: widen_rows(all_layers[layer]) for layer in layers}
            self._gather_scatter(
                dev, host_buf, host_indices, device_indices, layers, to_host=to_host
            )
            return
        else:
            host_blocks, dev_blocks = self._layer_blocks(self.kv_buffer, all_layers, layers, runs)
        if to_host:
            copy_pairs(host_blocks, dev_blocks)
        else:
            copy_pairs(dev_blocks, host_blocks)

    def _addressable(self, all_layers: list[torch.Tensor], layers: Sequence[int]) -> bool:
        """Whether each (layer, run) is one contiguous byte range on both sides, in CPU memory."""
        if self.layout is HostLayout.PAGE_FIRST or self.kv_buffer.device.type != "cpu":
            return False
        return all(
            all_layers[layer].device.type == "cpu" and all_layers[layer].is_contiguous()
            for layer in layers
        )

    def _memmove_copy(
        self,
        all_layers: list[torch.Tensor],
        layers: Sequence[int],
        plan: _RowPlan,
        *,
        to_host: bool,
    ) -> None:
        """Copy each (layer, block) by address (``_block_layout``); CPU buffers only."""
        blocks = self._block_layout(plan)
        # Raw addresses: re-check the bounds the pool validated, so no bug can write outside.
        if blocks.host_end > self.size or blocks.dev_end > all_layers[layers[0]].shape[0]:
            raise RuntimeError("internal error: validated indices out of range in the copy plan")
        host_base = self.kv_buffer.data_ptr()
        host_addrs: list[int] = []
        dev_addrs: list[int] = []
        for layer in layers:
            h_base = host_base + layer * blocks.host_layer_step
            d_base = all_layers[layer].data_ptr()
            host_addrs += [h_base + offset for offset in blocks.host_offsets]
            dev_addrs += [d_base + offset for offset in blocks.dev_offsets]
        sizes = blocks.sizes * len(layers)
        if to_host:
            memmove_blocks(host_addrs, dev_addrs, sizes)
        else:
            memmove_blocks(dev_addrs, host_addrs, sizes)

    def _layer_blocks(
        self,
        host_buf: torch.Tensor,
        all_layers: list[torch.Tensor],
        layers: Sequence[int],
        runs: IndexRuns,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One (host view, device view) pair per layer per run (``narrow`` is the cheapest view)."""
        host_blocks: list[torch.Tensor] = []
        dev_blocks: list[torch.Tensor] = []
        unit = self.page_size if self.layout is HostLayout.PAGE_FIRST_DIRECT else 1
        spans = [(h // unit, d // unit, n // unit) for h, d, n in runs]
        for layer in layers:
            host_layer = (
                host_buf[layer] if self.layout is HostLayout.LAYER_FIRST else host_buf[:, layer]
            )
            dev_layer = all_layers[layer]
            if self.layout is HostLayout.PAGE_FIRST_DIRECT:  # pages, also of one token
                dev_layer = dev_layer.view(-1, unit, *dev_layer.shape[1:])
            for h, d, n in spans:
                host_blocks.append(host_layer.narrow(0, h, n))
                dev_blocks.append(dev_layer.narrow(0, d, n))
        return host_blocks, dev_blocks

    def _all_layer_blocks(
        self, host_buf: torch.Tensor, stacked: torch.Tensor, runs: IndexRuns
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One (host view, device view) pair per run, covering every layer.

        ``stacked`` is the device as ``(layer, slot, 1, dim)``; each device view
        is permuted to the host layout's own dim order.
        """
        host_blocks: list[torch.Tensor] = []
        dev_blocks: list[torch.Tensor] = []
        ps = self.page_size
        layers = self.layer_num
        for h, d, n in runs:
            dev = stacked[:, d : d + n]
            if self.layout is HostLayout.LAYER_FIRST:
                host_blocks.append(host_buf[:, h : h + n])
                dev_blocks.append(dev)
            elif self.layout is HostLayout.PAGE_FIRST:
                host_blocks.append(host_buf[h : h + n])
                dev_blocks.append(dev.transpose(0, 1))
            else:
                host_blocks.append(host_buf[h // ps : (h + n) // ps])
                dev_blocks.append(dev.view(layers, n // ps, ps, *dev.shape[2:]).transpose(0, 1))
        return host_blocks, dev_blocks

    def _gather_scatter(
        self,
        dev: dict[int, torch.Tensor],
        host_buf: torch.Tensor,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layers: Sequence[int],
        *,
        to_host: bool,
    ) -> None:
        """One ``index_select`` + ``index_copy_`` per layer, over tokens or whole pages."""
        device = next(iter(dev.values())).device
        ps = self.page_size
        by_page = self.layout is HostLayout.PAGE_FIRST_DIRECT
        if by_page:
            h_idx = (host_indices[::ps] // ps).to("cpu")
            d_idx = (device_indices[::ps] // ps).to(device)
        else:
            h_idx = host_indices.to("cpu")
            d_idx = device_indices.to(device)
        for layer in layers:
            rows = host_buf[:, layer] if by_page else self.host_rows(layer, host_buf)
            assert rows is not None  # token rows exist for every layout but page_first_direct
            dev_rows = dev[layer].view(-1, ps, *dev[layer].shape[1:]) if by_page else dev[layer]
            if to_host:
                rows.index_copy_(0, h_idx, dev_rows.index_select(0, d_idx).to("cpu"))
            else:
                dev_rows.index_copy_(0, d_idx, rows.index_select(0, h_idx).to(device))

    def _backup(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend,
    ) -> None:
        self._direct_copy(
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
        self._direct_copy(device_pool, host_indices, device_indices, [layer_id], to_host=False)

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
