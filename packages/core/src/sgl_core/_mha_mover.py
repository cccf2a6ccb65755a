"""The ``direct`` mover of the MHA host layouts (``MHATokenHostPool``).

Each transfer moves two components, K and V, with the same runs. A
transfer is planned once as *runs* (index pairs where both sides step by
+1; whole pages in ``page_first_direct`` and ``page_head``). Per call, one
path is chosen, as for MLA (``RowDirectMover``), with the pool's ``CopyTuning``:

* backup, device layers equally spaced in one allocation, long runs: one
  strided copy per (component, run) across every layer;
* both sides in CPU memory, big contiguous blocks (``layer_first``,
  ``page_first_direct``): one ``memmove`` per (component, layer, block);
* short runs: one gather and one scatter per (component, layer);
* otherwise: one slice copy per (component, layer, run), batched.

A per-layer load reuses its plan while the host pool hands it the same
``Transfer`` (``PlanCache``): block addresses and gather buffers are kept, so
repeated loads of the same indices allocate nothing big.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

import torch

from sgl_core._copy import IndexRuns, memmove_blocks, merge_runs, widen_rows
from sgl_core._device_pool import stacked_layers
from sgl_core._engine import RunSide, copy_runs, gather_rows, run_options
from sgl_core._enums import HostLayout
from sgl_core._mha_device_pool import mha_device_layers
from sgl_core._mha_protocols import MHADevicePool
from sgl_core._transfer import PlanCache, Transfer
from sgl_core._tuning import CopyTuning, tuning_for

if TYPE_CHECKING:
    from sgl_core._mha_token_host_pool import MHATokenHostPool

__all__ = ["MHADirectMover"]

_PAGED = (HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD)
_ADDRESSABLE = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST_DIRECT)


@dataclasses.dataclass
class _Plan:
    """One transfer's runs and what its per-layer loads reuse."""

    runs: IndexRuns
    run_bytes: int  # average bytes of a run of one layer of one component
    block_bytes: int  # bytes of one by-address block of one layer of one component
    host_idx: torch.Tensor  # gather indices into the host rows (tokens or pages), CPU
    device_idx: torch.Tensor  # the same on the device side, CPU
    # per component: by-address blocks of one layer (host offset, device offset, size)
    blocks: list[tuple[list[int], list[int], list[int]]] | None = None
    # per layer: (device bases, host addresses, device addresses, sizes), K blocks then V
    addresses: dict[int, tuple[tuple[int, int], list[int], list[int], list[int]]] = (
        dataclasses.field(default_factory=dict)
    )
    staging: dict[tuple[int, int, torch.device], torch.Tensor] = dataclasses.field(
        default_factory=dict
    )


class MHADirectMover:
    """``direct`` io for ``layer_first``, ``page_first``, ``page_first_direct``, ``page_head``."""

    def __init__(self, pool: MHATokenHostPool) -> None:
        self.layout = pool.layout
        self.hosts = (pool.k_buffer, pool.v_buffer)
        self.rows = (pool.shape.k_row_bytes, pool.shape.v_row_bytes)
        self.layer_num = pool.layer_num
        self.size = pool.size
        self.paged = self.layout in _PAGED
        # page_head keeps heads outside tokens; every other layout has (H, D) innermost
        self.heads_inner = self.layout is not HostLayout.PAGE_HEAD
        self.wide = tuple(self._wide(h) for h in self.hosts)
        self.unit = pool.page_size if self.paged else 1
        self.tuning = pool.tuning
        self._plans: PlanCache[_Plan] = PlanCache()

    def _tuning(self, device_pool: MHADevicePool) -> CopyTuning:
        return self.tuning or tuning_for(device_pool.device)

    # ------------------------------------------------------------ the seam
    def check(self, device_pool: MHADevicePool) -> None:
        """Slice copies run with any per-layer device pool the host pool accepted."""

    def synchronize(self) -> None:
        """Copies return when done (cross-device ones are ordered on the current stream)."""

    def backup(self, transfer: Transfer[MHADevicePool]) -> None:
        plan = self.plan(transfer)
        tune = self._tuning(transfer.device_pool)
        comps = mha_device_layers(transfer.device_pool)
        stacks = [stacked_layers(c) if self.layer_num > 1 else None for c in comps]
        if plan.run_bytes >= tune.stacked_min_run_bytes and all(s is not None for s in stacks):
            pairs = [
                self._all_layer_sides(c, self._wide(s))
                for c, s in enumerate(stacks)
                if s is not None
            ]
            copy_runs(plan.runs, pairs, into_first=True, **run_options(tune))
        elif plan.block_bytes >= tune.by_address_min_block_bytes and self._addressable(comps):
            hosts: list[int] = []
            devs: list[int] = []
            sizes: list[int] = []
            for layer_id in range(self.layer_num):
                h, d, n = self._addresses(plan, layer_id, comps[0][layer_id], comps[1][layer_id])
                hosts += h
                devs += d
                sizes += n
            memmove_blocks(hosts, devs, sizes, threads=tune.copy_threads)
        elif plan.run_bytes < tune.gather_below_run_bytes:
            dst = [self._host_rows(c, i) for c in (0, 1) for i in range(self.layer_num)]
            src = [self._device_rows(self._wide(t)) for layers in comps for t in layers]
            gather_rows(dst, src, plan.host_idx, plan.device_idx, threads=tune.copy_threads)
        else:
            pairs = [
                self._layer_sides(c, i, layers[i])
                for c, layers in enumerate(comps)
                for i in range(self.layer_num)
            ]
            copy_runs(plan.runs, pairs, into_first=True, **run_options(tune))

    def load(self, transfer: Transfer[MHADevicePool], layer_id: int) -> None:
        plan = self._plans.get(transfer, self.plan)
        tune = self._tuning(transfer.device_pool)
        k_layers, v_layers = mha_device_layers(transfer.device_pool)
        k, v = k_layers[layer_id], v_layers[layer_id]
        if plan.block_bytes >= tune.by_address_min_block_bytes and self._addressable(([k], [v])):
            hosts, devs, sizes = self._addresses(plan, layer_id, k, v)
            memmove_blocks(devs, hosts, sizes, threads=tune.copy_threads)
        elif plan.run_bytes < tune.gather_below_run_bytes:
            for c, layer in ((0, k), (1, v)):
                dev = self._device_rows(self._wide(layer))
                rows = self._host_rows(c, layer_id)
                staged = self._staging(plan, c, rows, dev.device)
                gather_rows(
                    (dev,),
                    (rows,),
                    plan.device_idx,
                    plan.host_idx,
                    out=staged,
                    threads=tune.copy_threads,
                )
        else:
            pairs = (self._layer_sides(0, layer_id, k), self._layer_sides(1, layer_id, v))
            copy_runs(plan.runs, pairs, into_first=False, **run_options(tune))

    # ------------------------------------------------------------- planning
    def plan(self, transfer: Transfer[MHADevicePool]) -> _Plan:
        """Runs and gather indices of a validated transfer."""
        unit = self.unit
        h_cpu = transfer.host_indices[::unit].to("cpu")
        d_cpu = transfer.device_indices[::unit].to("cpu")
        runs = merge_runs(h_cpu, d_cpu, unit=unit)
        row = min(self.rows)
        run_bytes = row * transfer.count // max(len(runs), 1)
        return _Plan(
            runs=runs,
            run_bytes=run_bytes,
            block_bytes=unit * row if self.paged else run_bytes,
            host_idx=h_cpu // unit if self.paged else h_cpu,
            device_idx=d_cpu // unit if self.paged else d_cpu,
        )

    def _blocks(self, plan: _Plan) -> list[tuple[list[int], list[int], list[int]]]:
        """Per component: host and device byte offsets and sizes of one layer's blocks."""
        if plan.blocks is not None:
            return plan.blocks
        runs = plan.runs
        host_starts = torch.tensor(runs.src_starts, dtype=torch.int64)
        dev_starts = torch.tensor(runs.dst_starts, dtype=torch.int64)
        lengths = torch.tensor(runs.lengths, dtype=torch.int64)
        host_step = 1  # host rows between consecutive tokens of a block's first row
        if self.paged:  # each page is a block; host rows are (page, layer, token in page)
            ps = self.unit
            pages = lengths // ps
            within = torch.arange(int(pages.sum())) - torch.repeat_interleave(
                torch.cumsum(pages, 0) - pages, pages
            )
            host_starts = torch.repeat_interleave(host_starts, pages) + within * ps
            dev_starts = torch.repeat_interleave(dev_starts, pages) + within * ps
            lengths = torch.full_like(host_starts, ps)
            host_step = self.layer_num
        # Raw addresses: re-check the bounds the pool validated, so no bug can write outside.
        if int((host_starts + lengths).max()) > self.size:
            raise RuntimeError("internal error: validated indices out of range in the copy plan")
        plan.blocks = [
            (
                (host_starts * host_step * row).tolist(),
                (dev_starts * row).tolist(),
                (lengths * row).tolist(),
            )
            for row in self.rows
        ]
        return plan.blocks

    def _addressable(
        self, comps: tuple[list[torch.Tensor], list[torch.Tensor]] | tuple[list[torch.Tensor], ...]
    ) -> bool:
        """Whether each (layer, block) is one contiguous byte range on both sides, in CPU memory."""
        if self.layout not in _ADDRESSABLE or self.hosts[0].device.type != "cpu":
            return False
        return all(t.device.type == "cpu" and t.is_contiguous() for c in comps for t in c)

    def _host_layer_base(self, c: int, layer_id: int) -> int:
        host = self.hosts[c]
        step = self.size if self.layout is HostLayout.LAYER_FIRST else self.unit
        return host.data_ptr() + layer_id * step * self.rows[c]

    def _addresses(
        self, plan: _Plan, layer_id: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[list[int], list[int], list[int]]:
        """Host addresses, device addresses and sizes of one layer's K then V blocks (kept)."""
        bases = (k.data_ptr(), v.data_ptr())
        cached = plan.addresses.get(layer_id)
        if cached is not None and cached[0] == bases:
            return cached[1], cached[2], cached[3]
        hosts: list[int] = []
        devs: list[int] = []
        sizes: list[int] = []
        for c, (layer, (h_off, d_off, n)) in enumerate(
            zip((k, v), self._blocks(plan), strict=True)
        ):
            end = max(o + s for o, s in zip(d_off, n, strict=True))
            if end > layer.numel() * layer.element_size():
                raise RuntimeError(
                    "internal error: validated indices out of range in the copy plan"
                )
            host_base = self._host_layer_base(c, layer_id)
            hosts += [host_base + o for o in h_off]
            devs += [bases[c] + o for o in d_off]
            sizes += n
        plan.addresses[layer_id] = (bases, hosts, devs, sizes)
        return hosts, devs, sizes

    def _staging(
        self, plan: _Plan, c: int, rows: torch.Tensor, device: torch.device
    ) -> torch.Tensor:
        """This thread's gather buffer of component ``c`` for the plan."""
        key = (threading.get_ident(), c, device)
        staged = plan.staging.get(key)
        if staged is None:
            staged = torch.empty(
                (plan.host_idx.numel(), *rows.shape[1:]), dtype=rows.dtype, device=rows.device
            )
            plan.staging[key] = staged
        return staged

    # ---------------------------------------------------------------- views
    def _wide(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` with ``(H, D)`` merged into one row dim where heads are innermost, widened.

        Wide integer items keep one block of one layer under ATen's parallel
        grain, so each block copies serially instead of starting an OpenMP team
        (which, on a loaded machine, costs more than the copy).
        """
        return widen_rows(t.flatten(-2) if self.heads_inner else t)

    def _layer_of(self, host: torch.Tensor, layer_id: int) -> torch.Tensor:
        """One layer of a (widened) host component: ``(size, W)``, ``(pages, ps, W)``,
        or, for ``page_head``, ``(pages, H, ps, D)`` in the host's own order."""
        if self.layout is HostLayout.LAYER_FIRST:
            return host[layer_id]
        if self.layout is HostLayout.PAGE_HEAD:
            return host[:, :, :, layer_id]
        return host[:, layer_id]

    def _host_rows(self, c: int, layer_id: int) -> torch.Tensor:
        """Rows (or pages) of one layer of component ``c``, widened, gathered along dim 0."""
        return self._layer_of(self.wide[c], layer_id)

    def _device_rows(self, layer: torch.Tensor) -> torch.Tensor:
        """A widened device layer as the host rows' shape: slots, or pages ``(pages, ps, ...)``."""
        if not self.paged:
            return layer
        paged = layer.view(-1, self.unit, *layer.shape[1:])
        return paged if self.heads_inner else paged.transpose(1, 2)  # page_head: (pages, H, ps, D)

    def _layer_sides(self, c: int, layer_id: int, layer: torch.Tensor) -> tuple[RunSide, RunSide]:
        """Host and device side of one layer's run copies of component ``c`` (widened)."""
        host = RunSide(self._host_rows(c, layer_id), unit=self.unit)
        dev = self._wide(layer)
        if self.heads_inner:
            return host, RunSide(dev, page=self.unit if self.paged else 0)
        # page_head: the device block (H, pages, ps, D), transposed to the host's order
        return host, RunSide(dev.transpose(0, 1), axis=1, page=self.unit, transpose=True)

    def _all_layer_sides(self, c: int, stacked: torch.Tensor) -> tuple[RunSide, RunSide]:
        """Host and device side of run copies of component ``c`` across every layer.

        ``stacked`` is the widened device component as ``(layer, slot, W)``
        (``page_head``: ``(layer, slot, H, D)``); each side keeps its own dim
        order and the device block is transposed to the host's.
        """
        wide = self.wide[c]
        ps = self.unit
        if self.layout is HostLayout.LAYER_FIRST:
            return RunSide(wide, axis=1), RunSide(stacked, axis=1)
        if self.layout is HostLayout.PAGE_FIRST:
            return RunSide(wide), RunSide(stacked, axis=1, transpose=True)
        if self.layout is HostLayout.PAGE_FIRST_DIRECT:
            return RunSide(wide, unit=ps), RunSide(stacked, axis=1, page=ps, transpose=True)
        # page_head: host (pages, H, ps, L, D); device seen as (H, slot, L, D)
        dev = stacked.permute(2, 1, 0, 3)
        return RunSide(wide, unit=ps), RunSide(dev, axis=1, page=ps, transpose=True)
