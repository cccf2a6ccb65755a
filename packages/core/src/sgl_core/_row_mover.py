"""The ``direct`` mover of the token-row host layouts (``TokenRowHostPool``).

A transfer is planned once as *runs* (index pairs where both sides step by
+1; whole pages in ``page_first_direct``). Per call, one path is chosen:

* backup, device layers equally spaced in one allocation, long runs: one
  strided copy per run across every layer;
* both sides in CPU memory and big blocks: one ``memmove`` per (layer, block)
  by address (cheaper than building two tensor views per block);
* short runs: one gather and one scatter per layer;
* otherwise: one slice copy per (layer, run), batched.

The size limits come from the pool's ``CopyTuning`` (default: the preset of
the device pool's device, ``tuning_for``). A per-layer load
reuses the first layer's plan while the host pool hands it the same
``Transfer`` (``PlanCache``); a plan keeps its gather buffer and per-layer
addresses, so repeated loads of the same indices allocate nothing big.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sgl_core._copy import IndexRuns, memmove_blocks, merge_runs, widen_rows
from sgl_core._device_pool import device_layers, stacked_layers
from sgl_core._engine import RunSide, copy_runs, gather_rows, run_options
from sgl_core._enums import HostLayout
from sgl_core._protocols import MLADevicePool
from sgl_core._transfer import PlanCache, Transfer
from sgl_core._tuning import CopyTuning, tuning_for

if TYPE_CHECKING:
    from sgl_core._token_host_pool import TokenRowHostPool

__all__ = ["RowComponent", "RowDirectMover"]


@dataclasses.dataclass(frozen=True)
class RowComponent:
    """One host buffer of token rows and how to find its device rows.

    ``buffer`` is in the host layout's dim order with ``rows`` rows per token
    (model layers, or indexer slots); ``device_rows(device_pool)`` returns
    the matching per-row ``(slots, 1, dim)`` device tensors, validated.
    """

    buffer: torch.Tensor
    rows: int
    device_rows: Callable[[MLADevicePool], list[torch.Tensor]]


@dataclasses.dataclass
class _Plan:
    """One transfer's runs and what its per-layer loads reuse."""

    runs: IndexRuns
    run_bytes: int  # average bytes of a run of one layer
    block_bytes: int  # bytes of one by-address block of one layer
    host_idx: torch.Tensor  # gather indices into the host rows (tokens or pages), CPU
    device_idx: torch.Tensor  # the same on the device side, CPU
    # by-address blocks of one layer (host offset, device offset, size), made when needed
    blocks: tuple[list[int], list[int], list[int]] | None = None
    dev_end: int = 0  # one past the last device byte a block of one layer touches
    addresses: dict[int, tuple[int, list[int], list[int]]] = dataclasses.field(default_factory=dict)
    staging: dict[tuple[int, torch.device], torch.Tensor] = dataclasses.field(default_factory=dict)


class RowDirectMover:
    """``direct`` io for ``layer_first``, ``page_first`` and ``page_first_direct``.

    Moves the pool's KV rows, or with ``component`` another buffer of token
    rows in the same layout (the indexer cache), row ``i`` of which a load of
    ``i`` moves.
    """

    def __init__(self, pool: TokenRowHostPool, component: RowComponent | None = None) -> None:
        if component is None:
            component = RowComponent(pool.kv_buffer, pool.layer_num, device_layers)
        self.layout = pool.layout
        self.kv_buffer = component.buffer
        self.wide = widen_rows(component.buffer)
        self.layer_num = component.rows
        self._device_layers = component.device_rows
        self.size = pool.size
        self.row = component.buffer.shape[-1] * component.buffer.element_size()
        # page_first_direct keeps a run's pages a layer stride apart: it moves whole pages
        self.paged = self.layout is HostLayout.PAGE_FIRST_DIRECT
        self.unit = pool.page_size if self.paged else 1
        self.host_layer_step = (self.unit if self.paged else self.size) * self.row
        self.tuning = pool.tuning
        self._plans: PlanCache[_Plan] = PlanCache()

    def _tuning(self, device_pool: MLADevicePool) -> CopyTuning:
        return self.tuning or tuning_for(device_pool.device)

    # ------------------------------------------------------------ the seam
    def check(self, device_pool: MLADevicePool) -> None:
        """Slice copies run with any per-layer device pool the host pool accepted."""

    def synchronize(self) -> None:
        """Copies return when done (cross-device ones are ordered on the current stream)."""

    def backup(self, transfer: Transfer) -> None:
        plan = self.plan(transfer)
        tune = self._tuning(transfer.device_pool)
        layers = self._device_layers(transfer.device_pool)
        stacked = stacked_layers(layers) if self.layer_num > 1 else None
        if stacked is not None and plan.run_bytes >= tune.stacked_min_run_bytes:
            pair = self._all_layer_sides(widen_rows(stacked))
            copy_runs(plan.runs, (pair,), into_first=True, **run_options(tune))
        elif plan.block_bytes >= tune.by_address_min_block_bytes and self._addressable(layers):
            for layer_id, layer in enumerate(layers):
                sizes, host_addrs, dev_addrs = self._addresses(plan, layer_id, layer)
                memmove_blocks(host_addrs, dev_addrs, sizes, threads=tune.copy_threads)
        elif plan.run_bytes < tune.gather_below_run_bytes:
            hosts = [self._host_rows(layer_id) for layer_id in range(self.layer_num)]
            devs = [self._device_rows(widen_rows(layer)) for layer in layers]
            gather_rows(hosts, devs, plan.host_idx, plan.device_idx, threads=tune.copy_threads)
        else:
            pairs = [self._layer_sides(i, layer) for i, layer in enumerate(layers)]
            copy_runs(plan.runs, pairs, into_first=True, **run_options(tune))

    def load(self, transfer: Transfer, layer_id: int) -> None:
        plan = self._plans.get(transfer, self.plan)
        tune = self._tuning(transfer.device_pool)
        layer = self._device_layers(transfer.device_pool)[layer_id]
        if plan.block_bytes >= tune.by_address_min_block_bytes and self._addressable((layer,)):
            sizes, host_addrs, dev_addrs = self._addresses(plan, layer_id, layer)
            memmove_blocks(dev_addrs, host_addrs, sizes, threads=tune.copy_threads)
        elif plan.run_bytes < tune.gather_below_run_bytes:
            dev = self._device_rows(widen_rows(layer))
            rows = self._host_rows(layer_id)
            staged = self._staging(plan, rows, dev.device)
            gather_rows(
                (dev,),
                (rows,),
                plan.device_idx,
                plan.host_idx,
                out=staged,
                threads=tune.copy_threads,
            )
        else:
            pair = self._layer_sides(layer_id, layer)
            copy_runs(plan.runs, (pair,), into_first=False, **run_options(tune))

    # ------------------------------------------------------------- planning
    def plan(self, transfer: Transfer) -> _Plan:
        """Runs and gather indices of a validated transfer."""
        unit = self.unit
        h_cpu = transfer.host_indices[::unit].to("cpu")
        d_cpu = transfer.device_indices[::unit].to("cpu")
        runs = merge_runs(h_cpu, d_cpu, unit=unit)
        run_bytes = self.row * transfer.count // max(len(runs), 1)
        return _Plan(
            runs=runs,
            run_bytes=run_bytes,
            block_bytes=unit * self.row if self.paged else run_bytes,
            host_idx=h_cpu // unit if self.paged else h_cpu,
            device_idx=d_cpu // unit if self.paged else d_cpu,
        )

    def _blocks(self, plan: _Plan) -> tuple[list[int], list[int], list[int]]:
        """Byte offsets and sizes of every block of one layer (host from the buffer)."""
        if plan.blocks is not None:
            return plan.blocks
        runs, row = plan.runs, self.row
        host_starts = torch.tensor(runs.src_starts, dtype=torch.int64)
        dev_starts = torch.tensor(runs.dst_starts, dtype=torch.int64)
        lengths = torch.tensor(runs.lengths, dtype=torch.int64)
        host_row_step = row
        if self.paged:  # each page is a block; host rows are (page, layer, token in page)
            ps = self.unit
            pages = lengths // ps
            within = torch.arange(int(pages.sum())) - torch.repeat_interleave(
                torch.cumsum(pages, 0) - pages, pages
            )
            host_starts = torch.repeat_interleave(host_starts, pages) + within * ps
            dev_starts = torch.repeat_interleave(dev_starts, pages) + within * ps
            lengths = torch.full_like(host_starts, ps)
            host_row_step = self.layer_num * row
        # Raw addresses: re-check the bounds the pool validated, so no bug can write outside.
        if int((host_starts + lengths).max()) > self.size:
            raise RuntimeError("internal error: validated indices out of range in the copy plan")
        plan.blocks = (
            (host_starts * host_row_step).tolist(),
            (dev_starts * row).tolist(),
            (lengths * row).tolist(),
        )
        plan.dev_end = int(((dev_starts + lengths) * row).max())
        return plan.blocks

    def _addressable(self, layers: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> bool:
        """Whether each (layer, block) is one contiguous byte range on both sides, in CPU memory."""
        if self.layout is HostLayout.PAGE_FIRST or self.kv_buffer.device.type != "cpu":
            return False
        return all(t.device.type == "cpu" and t.is_contiguous() for t in layers)

    def _addresses(
        self, plan: _Plan, layer_id: int, layer: torch.Tensor
    ) -> tuple[list[int], list[int], list[int]]:
        """Sizes, host and device addresses of one layer's blocks (kept for repeated loads)."""
        host_offsets, dev_offsets, sizes = self._blocks(plan)
        base = layer.data_ptr()
        cached = plan.addresses.get(layer_id)
        if cached is not None and cached[0] == base:
            return sizes, cached[1], cached[2]
        if plan.dev_end > layer.numel() * layer.element_size():
            raise RuntimeError("internal error: validated indices out of range in the copy plan")
        host_base = self.kv_buffer.data_ptr() + layer_id * self.host_layer_step
        host_addrs = [host_base + o for o in host_offsets]
        dev_addrs = [base + o for o in dev_offsets]
        plan.addresses[layer_id] = (base, host_addrs, dev_addrs)
        return sizes, host_addrs, dev_addrs

    def _staging(self, plan: _Plan, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
        """This thread's gather buffer for the plan (threads may load the same transfer)."""
        key = (threading.get_ident(), device)
        staged = plan.staging.get(key)
        if staged is None:
            staged = torch.empty(
                (plan.host_idx.numel(), *rows.shape[1:]), dtype=rows.dtype, device=rows.device
            )
            plan.staging[key] = staged
        return staged

    # ---------------------------------------------------------------- views
    def _host_rows(self, layer_id: int) -> torch.Tensor:
        """Rows (or, in page_first_direct, pages) of one layer, widened."""
        if self.layout is HostLayout.LAYER_FIRST:
            return self.wide[layer_id]
        return self.wide[:, layer_id]

    def _device_rows(self, layer: torch.Tensor) -> torch.Tensor:
        if self.paged:
            return layer.view(-1, self.unit, *layer.shape[1:])
        return layer

    def _layer_sides(self, layer_id: int, layer: torch.Tensor) -> tuple[RunSide, RunSide]:
        """Host and device side of one layer's run copies (unwidened: blocks copy in parallel)."""
        lf = self.layout is HostLayout.LAYER_FIRST
        host = self.kv_buffer[layer_id] if lf else self.kv_buffer[:, layer_id]
        return RunSide(host, unit=self.unit), RunSide(layer, page=self.unit if self.paged else 0)

    def _all_layer_sides(self, stacked: torch.Tensor) -> tuple[RunSide, RunSide]:
        """Host and device side of run copies across every layer.

        ``stacked`` is the device as ``(layer, slot, 1, dim)``; its blocks are
        transposed to the host layout's own dim order where that is page-major.
        """
        if self.layout is HostLayout.LAYER_FIRST:
            return RunSide(self.wide, axis=1), RunSide(stacked, axis=1)
        if self.layout is HostLayout.PAGE_FIRST:
            return RunSide(self.wide), RunSide(stacked, axis=1, transpose=True)
        ps = self.unit
        return RunSide(self.wide, unit=ps), RunSide(stacked, axis=1, page=ps, transpose=True)
