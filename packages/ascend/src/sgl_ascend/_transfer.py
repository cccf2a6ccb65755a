"""``kernel_ascend`` copies: (pages x rows) blocks between device and host tensors.

Every component is a pair of 5-D tensors with the page and row axes swapped::

    host   (host_pages,   rows, page_size, heads, dim)   page-major (page_first_kv_split)
    device (rows, device_pages, page_size, heads, dim)   layer-major (Ascend device pools)

where ``rows`` are model layers (k, v) or indexer slots (index_k, scale), and
``heads`` is 1 for MLA components and ``head_num`` for MHA K and V. How a
transfer is planned (:func:`plan_pages`) and copied: docs/design.md, section 6,
``kernel_ascend``. A CPU load with big pages copies each page by address
(``memmove_step``): cheaper than a run copy's views.

Between devices (an NPU pool and a pinned host pool) the run copies are
non-blocking, on a side stream ordered after the caller's (``_npu.transfer_stream``):
synchronize it or record an event before the host reads backed-up bytes. Arguments
are assumed validated (by ``sgl_core``'s host-pool base): page aligned, in range,
destination pages distinct.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from sgl_ascend import _npu
from sgl_core.backend import (
    NEVER,
    CopyTuning,
    HostSide,
    IndexRuns,
    PlanCache,
    RunSide,
    Step,
    Transfer,
    backup_path,
    copy_runs,
    finish,
    gather_rows,
    gather_step,
    memmove_step,
    merge_runs,
    numpy_rows,
    page_numbers,
    slices_may_copy,
    slices_shape,
    slices_step,
    tuning_for,
    widen_rows,
)

__all__ = ["KvSplitMover", "PagePlan", "backup_rows", "plan_pages"]


@dataclasses.dataclass(frozen=True)
class PagePlan:
    """Paired page numbers of one transfer and their merged runs (in pages)."""

    host_pages: torch.Tensor
    device_pages: torch.Tensor
    runs: IndexRuns

    @property
    def num_pages(self) -> int:
        return int(self.host_pages.numel())


def plan_pages(
    host_indices: torch.Tensor, device_indices: torch.Tensor, page_size: int
) -> PagePlan:
    """Page numbers of page-aligned token runs, merged where both sides step by one page."""
    host_pages, device_pages = (
        page_numbers(t[::page_size].to("cpu"), page_size) for t in (host_indices, device_indices)
    )
    return PagePlan(host_pages, device_pages, merge_runs(host_pages, device_pages))


def _page_bytes(tensor: torch.Tensor, rows: int) -> int:
    """Bytes of ``rows`` rows of one page of a 5-D component (``(.., page_size, heads, dim)``)."""
    return rows * math.prod(tensor.shape[2:]) * tensor.element_size()


def _short_runs(plan: PagePlan, bytes_per_page: int, tuning: CopyTuning) -> bool:
    """Whether runs average under ``tuning.gather_below_page_run_bytes`` (gather instead)."""
    runs = len(plan.runs)
    limit = tuning.gather_below_page_run_bytes
    return runs > 1 and plan.num_pages * bytes_per_page < limit * runs


def backup_rows(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], plan: PagePlan, tuning: CopyTuning
) -> None:
    """Device -> host for every row of every ``(host, device)`` component pair."""
    if not pairs or not plan.num_pages:
        return
    device = pairs[0][1].device
    per_page = sum(_page_bytes(h, int(h.shape[1])) for h, _ in pairs)
    with _npu.transfer_stream(device):
        if _short_runs(plan, per_page, tuning):
            # Gathers the device's page axis (1), then moves pages to dim 0 for the host.
            hosts, devs = [h for h, _ in pairs], [d for _, d in pairs]
            gather_rows(hosts, devs, plan.host_pages, plan.device_pages, axis=1)
            return
        run_bytes = plan.num_pages * per_page // len(plan.runs)  # every row, on average
        if device.type == "cpu" and slices_may_copy(tuning.copy_threads, run_bytes):
            # per pair, core's ``backup_path``: the slices step or torch's run copies
            runs = [(b, a, n) for a, b, n in plan.runs]
            ends = (max(d + n for d, _, n in runs), max(h + n for _, h, n in runs))
            for host, dev in pairs:
                src, dst = numpy_rows(widen_rows(dev).transpose(0, 1)), numpy_rows(widen_rows(host))
                step = slices_step(dst, src, runs, ends, tuning.copy_threads, "backup")
                nbytes = plan.num_pages * _page_bytes(host, int(host.shape[1]))
                torch_runs = functools.partial(_run_copies, [(host, dev)], plan, tuning)
                shape = slices_shape(dst, src, runs)[1]
                backup_path(step, torch_runs, tuning.copy_threads, shape, nbytes)()
            return
        _run_copies(pairs, plan, tuning)


def _run_copies(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], plan: PagePlan, tuning: CopyTuning
) -> None:
    """Device -> host run copies of every row of every pair by torch (``copy_runs``)."""
    sides = [
        (RunSide(widen_rows(h)), RunSide(widen_rows(d), axis=1, transpose=True)) for h, d in pairs
    ]
    copy_runs(
        plan.runs, sides, into_first=True, batched=tuning.batched_cross_device, runs_outer=True,
        threads=tuning.copy_threads,
    )  # fmt: skip


def _row_addresses(
    triples: Sequence[tuple[torch.Tensor, torch.Tensor, int]], plan: PagePlan
) -> tuple[list[int], list[int], list[int]] | None:
    """Device and host addresses and sizes of one ``memmove`` per (page, component), or None."""
    for host, dev, _ in triples:
        if not (host.is_contiguous() and dev.is_contiguous()):
            return None
    host_pages = plan.host_pages
    dev_pages = plan.device_pages
    dst: list[int] = []
    src: list[int] = []
    sizes: list[int] = []
    for host, dev, row in triples:
        item = host.element_size()
        # Raw addresses: re-check the bounds the pool validated, so no bug can write outside.
        if (
            int(host_pages.max()) >= host.shape[0]
            or int(dev_pages.max()) >= dev.shape[1]
            or not 0 <= row < min(host.shape[1], dev.shape[0])
        ):
            raise RuntimeError("internal error: validated pages out of range in the copy plan")
        host_base = host.data_ptr() + row * host.stride(1) * item
        dev_base = dev.data_ptr() + row * dev.stride(0) * item
        src += (host_pages * (host.stride(0) * item) + host_base).tolist()
        dst += (dev_pages * (dev.stride(1) * item) + dev_base).tolist()
        sizes += [_page_bytes(host, 1)] * plan.num_pages
    return dst, src, sizes


def _cpu_steps(
    triples: Sequence[tuple[torch.Tensor, torch.Tensor, int]],
    plan: PagePlan,
    per_page: int,
    tuning: CopyTuning,
    staging: dict[tuple[int, int], torch.Tensor],
) -> list[Step]:
    """A CPU load's copy steps: by address (big pages), gathers (short runs) or run copies."""
    threads = tuning.copy_threads
    limit = tuning.by_address_min_block_bytes
    if limit != NEVER and tuning.load_gather_below_run_bytes is not None:
        # pages a gather would copy twice (select, then scatter) go by address from there
        limit = min(limit, tuning.load_gather_below_run_bytes)
    if per_page >= limit:
        blocks = _row_addresses(triples, plan)
        if blocks is not None:
            return [memmove_step(*blocks, threads)]
    pairs = [(widen_rows(host[:, row]), widen_rows(dev[row])) for host, dev, row in triples]
    if _short_runs(plan, per_page, tuning):
        steps = []
        for c, (host, dev) in enumerate(pairs):
            # one buffer per (thread, component) for every layer of the plan: its layers'
            # loads run one after the other on that thread
            key = (threading.get_ident(), c)
            buf = staging.get(key)
            if buf is None or buf.dtype != host.dtype or buf.shape[1:] != host.shape[1:]:
                buf = torch.empty((plan.num_pages, *host.shape[1:]), dtype=host.dtype)
                staging[key] = buf
            steps.append(gather_step(dev, host, plan.device_pages, plan.host_pages, buf, threads))
        return steps
    runs = list(plan.runs)
    extent = (
        max((a + n for a, _, n in runs), default=0),
        max((b + n for _, b, n in runs), default=0),
    )
    return [
        slices_step(numpy_rows(dev), numpy_rows(host), runs, extent, threads) for host, dev in pairs
    ]


@dataclasses.dataclass
class _LoadPlan:
    """A transfer's page plan and, per row, the by-address blocks of its loads."""

    pages: PagePlan
    #: per (thread, layer) of a load between CPU tensors: its bound copy steps
    steps: dict[tuple[int, int], list[Step]] = dataclasses.field(default_factory=dict)
    #: per (thread, component): the gather buffer of its loads' gather steps
    staging: dict[tuple[int, int], torch.Tensor] = dataclasses.field(default_factory=dict)


class KvSplitMover:
    """``kernel_ascend`` io of ``page_first_kv_split``: whole pages, every component.

    Built from the host side alone; it runs MLA pools (k, v[, index_k[, scale]])
    and MHA pools (k, v) alike.
    """

    def __init__(self, side: HostSide) -> None:
        self.buffers = [p.buffer for p in side.parts]
        self.page_size = side.page_size
        self.tuning = side.tuning
        self._names = [p.component.device_name for p in side.parts]
        #: Per layer: each component's row (None: the component has none for it).
        self._rows = [[p.component.slot(i) for p in side.parts] for i in range(side.layer_num)]
        self._plans: PlanCache[_LoadPlan] = PlanCache()
        self._queued_on: set[torch.device] = set()

    def check(self, device_pool: object) -> None:
        """The host pool checks the device pool's components; nothing more here."""

    def synchronize(self) -> None:
        """Wait for the copies queued on NPU streams (no-op on CPU)."""
        for device in list(self._queued_on):
            _npu.synchronize(device)

    def backup(self, transfer: Transfer[Any]) -> None:
        pool = transfer.device_pool
        pairs = [(h, getattr(pool, n)) for h, n in zip(self.buffers, self._names, strict=True)]
        device = pairs[0][1].device
        self._queued_on.add(device)
        backup_rows(pairs, self._pages(transfer), self.tuning or tuning_for(device))

    def load(self, transfer: Transfer[Any], layer_id: int) -> None:
        """Host -> device of one layer (and its indexer row); other rows untouched."""
        pool = transfer.device_pool
        plan = self._plans.get(transfer, lambda t: _LoadPlan(self._pages(t)))
        pages = plan.pages
        triples = [
            (host, getattr(pool, name), row)
            for host, name, row in zip(self.buffers, self._names, self._rows[layer_id], strict=True)
            if row is not None
        ]
        device = triples[0][1].device
        tune = self.tuning or tuning_for(device)
        per_page = sum(_page_bytes(h, 1) for h, _, _ in triples)
        if self.buffers[0].device == device and device.type == "cpu":
            key = (threading.get_ident(), layer_id)  # gather steps hold this thread's buffers
            if key not in plan.steps:  # the memo re-checked the storage
                plan.steps[key] = _cpu_steps(triples, pages, per_page, tune, plan.staging)
            for step in plan.steps[key]:  # the primitive itself, called from here
                rest = step.start_rest()
                try:
                    step.fn(*step.parts[0])
                finally:
                    finish(rest)
            return
        self._queued_on.add(device)
        with _npu.transfer_stream(device):
            if _short_runs(pages, per_page, tune):
                hosts = [host[:, row] for host, _, row in triples]
                devs = [dev[row] for _, dev, row in triples]
                gather_rows(
                    devs, hosts, pages.device_pages, pages.host_pages, threads=tune.copy_threads
                )
                return
            # One page of one row in its own dtype is big enough for ATen to copy
            # with all cores (faster here than serial wide-int blocks).
            sides = [(RunSide(host[:, row]), RunSide(dev[row])) for host, dev, row in triples]
            copy_runs(
                pages.runs, sides, into_first=False, batched=tune.batched_cross_device,
                runs_outer=True, threads=tune.copy_threads,
            )  # fmt: skip

    def _pages(self, transfer: Transfer[Any]) -> PagePlan:
        return plan_pages(transfer.host_indices, transfer.device_indices, self.page_size)
