"""The ``direct`` mover of every token-row host layout, for every kind of KV rows.

It moves the host parts (``HostSide.parts``: one buffer per component of the KV
spec) with the same runs; per call and part one path is chosen with the pool's
``CopyTuning``, and the parts that chose the same path share one call
(docs/design.md, "Transfers (torch backend)" and "Choosing a copy path"). A
component kept on a subset of layers (the DSA indexer) moves, on a per-layer
load, only when the layer has a row of it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sgl_core.kv._layouts import layout_facts
from sgl_core.kv.device._device_rows import stacked_layers
from sgl_core.transfer._direct_load import Plan, backup_path, backup_slices, load_steps
from sgl_core.transfer._transfer import HostPart, HostSide, PlanCache, Transfer
from sgl_core.transfer.copy._copy import memmove_blocks, widen_rows
from sgl_core.transfer.copy._engine import RunSide, copy_runs, gather_rows, run_options
from sgl_core.transfer.copy._pieces import merge_runs, page_numbers
from sgl_core.transfer.copy._steps import Step, finish
from sgl_core.transfer.copy._tuning import CopyTuning, tuning_for

__all__ = ["DirectMover"]

_INTERNAL = "internal error: validated indices out of range in the copy plan"


class DirectMover:
    """``direct`` io for ``layer_first``, ``page_first``, ``page_first_direct``, ``page_head``.

    ``parts`` default to every part of ``host``; a backend that moves some
    components by its own io passes the rest here.
    """

    def __init__(self, host: HostSide, parts: Sequence[HostPart] | None = None) -> None:
        self.parts = tuple(host.parts if parts is None else parts)
        self.facts = layout_facts(host.layout)
        self.layout = host.layout
        self.size = host.size
        self.layer_num = host.layer_num
        self.paged = self.facts.paged
        self.unit = host.page_size if self.paged else 1
        self.tuning = host.tuning
        self.rows = tuple(p.component.row_bytes for p in self.parts)
        self.wide = tuple(self._wide(p.buffer) for p in self.parts)
        self._plans: PlanCache[Plan] = PlanCache()
        self.host_np: dict[tuple[int, int], Any] = {}  # (part, row): numpy view of its rows

    def _tuning(self, device_pool: Any) -> CopyTuning:
        return self.tuning or tuning_for(device_pool.device)

    # ------------------------------------------------------------ the seam
    def check(self, device_pool: Any) -> None:
        """Slice copies run with any per-layer device pool the host pool accepted."""

    def synchronize(self) -> None:
        """Copies return when done (cross-device ones are ordered on the current stream)."""

    def backup(self, transfer: Transfer[Any]) -> None:
        plan = self.plan(transfer)
        tune = self._tuning(transfer.device_pool)
        runs: list[tuple[RunSide, RunSide]] = []
        addrs: tuple[list[int], list[int], list[int]] = ([], [], [])
        g_dst: list[torch.Tensor] = []
        g_src: list[torch.Tensor] = []
        copies: list[Callable[[], None]] = []  # per stacked part: its chosen path
        for c in range(len(self.parts)):
            layers = self._device(transfer.device_pool, c)
            run_bytes, block_bytes = self._sizes(plan, c, transfer.count)
            stacked = stacked_layers(layers) if len(layers) > 1 else None
            if stacked is not None and run_bytes >= tune.stacked_min_run_bytes:
                sliced = backup_slices(self, plan, c, stacked, tune.copy_threads, run_bytes)
                sides = self._all_row_sides(c, self._wide(stacked))
                nbytes = self.rows[c] * transfer.count * len(layers)
                torch_runs = functools.partial(
                    copy_runs, plan.runs, [sides], into_first=True, **run_options(tune)
                )
                if sliced is not None:
                    step, shape = sliced
                    copies.append(backup_path(step, torch_runs, tune.copy_threads, shape, nbytes))
                else:
                    runs.append(sides)
            elif block_bytes >= tune.by_address_min_block_bytes and self._addressable(c, layers):
                for r, layer in enumerate(layers):  # host, device, sizes
                    for acc, got in zip(addrs, self._addresses(plan, c, r, layer), strict=True):
                        acc.extend(got)
            elif run_bytes < tune.gather_below_run_bytes:
                g_dst += [self._host_rows(c, r) for r in range(len(layers))]
                g_src += [self._device_rows(self._wide(layer)) for layer in layers]
            else:
                runs += [self._row_sides(c, r, layer) for r, layer in enumerate(layers)]
        if addrs[0]:
            memmove_blocks(addrs[0], addrs[1], addrs[2], threads=tune.copy_threads)
        if g_dst:
            gather_rows(g_dst, g_src, plan.host_idx, plan.device_idx, threads=tune.copy_threads)
        if runs:
            copy_runs(plan.runs, runs, into_first=True, **run_options(tune))
        for copy in copies:
            copy()

    def load(self, transfer: Transfer[Any], layer_id: int) -> None:
        for step in self.bound_steps(transfer, layer_id):  # the primitive, called from here
            rest = step.start_rest()
            try:
                step.fn(*step.parts[0])
            finally:
                finish(rest)

    def bound_steps(self, transfer: Transfer[Any], layer_id: int) -> Sequence[Step]:
        """The bound copy steps of a validated transfer's load of ``layer_id``.

        Built on the layer's first load (per thread: steps hold this thread's
        gather buffers) and again when a device layer's address changed; a
        subclass that wraps ``load`` runs them itself, so the primitive stays
        one frame below its ``load``.
        """
        plan = self._plans.get(transfer, self.plan)
        key = (threading.get_ident(), layer_id)
        kept = plan.steps.get(key)
        pool = transfer.device_pool  # the device tensors this load writes, by address
        bases = tuple(
            self._device(pool, c)[r].data_ptr()
            for c, part in enumerate(self.parts)
            if (r := part.component.slot(layer_id)) is not None
        )
        if kept is None or kept[0] != bases:
            kept = (bases, load_steps(self, plan, transfer, layer_id))
            plan.steps[key] = kept
        return kept[1]

    # ------------------------------------------------------------- planning
    def plan(self, transfer: Transfer[Any]) -> Plan:
        """Runs and gather indices of a validated transfer."""
        h_cpu = transfer.host_indices[:: self.unit].to("cpu")
        d_cpu = transfer.device_indices[:: self.unit].to("cpu")
        return Plan(
            runs=merge_runs(h_cpu, d_cpu, unit=self.unit),
            host_idx=page_numbers(h_cpu, self.unit) if self.paged else h_cpu,
            device_idx=page_numbers(d_cpu, self.unit) if self.paged else d_cpu,
        )

    def _sizes(self, plan: Plan, c: int, count: int) -> tuple[int, int]:
        """Average bytes of one run of one row of part ``c``, and of one by-address block."""
        row = self.rows[c]
        run_bytes = row * count // max(len(plan.runs), 1)
        return run_bytes, self.unit * row if self.paged else run_bytes

    def _device(self, device_pool: Any, c: int) -> list[torch.Tensor]:
        # The host pool validated this list (length, shapes, dtypes, storage).
        tensors: list[torch.Tensor] = getattr(device_pool, self.parts[c].component.device_name)
        return tensors

    def _blocks(self, plan: Plan, c: int) -> tuple[list[int], list[int], list[int], int]:
        """Host and device byte offsets and sizes of one row's blocks of part ``c``, and the
        end of the last device byte they touch."""
        cached = plan.blocks.get(c)
        if cached is not None:
            return cached
        runs, row = plan.runs, self.rows[c]
        host_starts = torch.tensor(runs.src_starts, dtype=torch.int64)
        dev_starts = torch.tensor(runs.dst_starts, dtype=torch.int64)
        lengths = torch.tensor(runs.lengths, dtype=torch.int64)
        host_step = 1  # host rows between consecutive tokens of a block's first row
        if self.paged:  # each page is a block; host rows are (page, row, token in page)
            ps = self.unit
            pages = lengths // ps
            within = torch.arange(int(pages.sum())) - torch.repeat_interleave(
                torch.cumsum(pages, 0) - pages, pages
            )
            host_starts = torch.repeat_interleave(host_starts, pages) + within * ps
            dev_starts = torch.repeat_interleave(dev_starts, pages) + within * ps
            lengths = torch.full_like(host_starts, ps)
            host_step = self.parts[c].component.rows(self.layer_num)
        # Raw addresses: re-check the bounds the pool validated, so no bug can write outside.
        if int((host_starts + lengths).max()) > self.size:
            raise RuntimeError(_INTERNAL)
        blocks = (
            (host_starts * host_step * row).tolist(),
            (dev_starts * row).tolist(),
            (lengths * row).tolist(),
            int(((dev_starts + lengths) * row).max()),
        )
        plan.blocks[c] = blocks
        return blocks

    def _addressable(self, c: int, layers: Sequence[torch.Tensor]) -> bool:
        """Whether each (row, block) is one contiguous byte range on both sides, in CPU memory."""
        if not self.facts.addressable or self.parts[c].buffer.device.type != "cpu":
            return False
        return all(t.device.type == "cpu" and t.is_contiguous() for t in layers)

    def _addresses(
        self, plan: Plan, c: int, r: int, layer: torch.Tensor
    ) -> tuple[list[int], list[int], list[int]]:
        """Host addresses, device addresses and sizes of row ``r``'s blocks of part ``c`` (kept)."""
        host_offsets, dev_offsets, sizes, dev_end = self._blocks(plan, c)
        base = layer.data_ptr()
        cached = plan.addresses.get((c, r))
        if cached is not None and cached[0] == base:
            return cached[1], cached[2], sizes
        if dev_end > layer.numel() * layer.element_size():
            raise RuntimeError(_INTERNAL)
        step = self.unit if self.paged else self.size  # tokens between two rows' first bytes
        host_base = self.parts[c].buffer.data_ptr() + r * step * self.rows[c]
        hosts = [host_base + o for o in host_offsets]
        devs = [base + o for o in dev_offsets]
        plan.addresses[(c, r)] = (base, hosts, devs)
        return hosts, devs, sizes

    # ---------------------------------------------------------------- views
    def _wide(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` with ``(H, D)`` merged into one row dim where heads are innermost, widened.

        Wide integer items keep one block of one row under ATen's parallel
        grain, so each block copies serially instead of starting an OpenMP team.
        """
        return widen_rows(t.flatten(-2) if self.facts.heads_inner else t)

    def _host_rows(self, c: int, r: int) -> torch.Tensor:
        """Row ``r``'s tokens (or pages) of part ``c``, widened, gathered along dim 0."""
        return self.facts.row(self.wide[c], r)

    def _device_rows(self, layer: torch.Tensor) -> torch.Tensor:
        """A widened device row as the host rows' shape: slots, or pages ``(pages, ps, ...)``."""
        if not self.paged:
            return layer
        paged = layer.view(-1, self.unit, *layer.shape[1:])
        return paged if self.facts.heads_inner else paged.transpose(1, 2)  # (pages, H, ps, D)

    def _row_sides(self, c: int, r: int, layer: torch.Tensor) -> tuple[RunSide, RunSide]:
        """Host and device side of one row's run copies of part ``c`` (widened)."""
        host = RunSide(self._host_rows(c, r), unit=self.unit)
        dev = self._wide(layer)
        if self.facts.heads_inner:
            return host, RunSide(dev, page=self.unit if self.paged else 0)
        # page_head: the device block (H, pages, ps, D), transposed to the host's order
        return host, RunSide(dev.transpose(0, 1), axis=1, page=self.unit, transpose=True)

    def _all_row_sides(self, c: int, stacked: torch.Tensor) -> tuple[RunSide, RunSide]:
        """Host and device side of run copies of part ``c`` across every (``stacked``) row."""
        wide, ps = self.wide[c], self.unit
        if not self.facts.heads_inner:  # page_head: host (P, H, ps, R, D); device (H, slot, R, D)
            dev = stacked.permute(2, 1, 0, 3)
            return RunSide(wide, unit=ps), RunSide(dev, axis=1, page=ps, transpose=True)
        if self.paged:
            return RunSide(wide, unit=ps), RunSide(stacked, axis=1, page=ps, transpose=True)
        if self.facts.rows_outer:  # layer_first: rows outermost on both sides
            return RunSide(wide, axis=1), RunSide(stacked, axis=1)
        return RunSide(wide), RunSide(stacked, axis=1, transpose=True)
