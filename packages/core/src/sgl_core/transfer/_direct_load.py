"""The ``direct`` mover's plan of a transfer, the copy steps of its per-layer loads and
of its CPU run-copy backups (docs/design.md, "Loads as bound copy steps").
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from sgl_core.transfer._transfer import Transfer
from sgl_core.transfer.copy._auto_copy import _bucket
from sgl_core.transfer.copy._calibrate import default_calibrator
from sgl_core.transfer.copy._engine import copy_runs, gather_rows, run_options
from sgl_core.transfer.copy._pieces import IndexRuns
from sgl_core.transfer.copy._steps import (
    SLICES_MAX_RUN_BYTES,
    Step,
    gather_step,
    memmove_step,
    numpy_rows,
    slices_shape,
    slices_step,
)
from sgl_core.transfer.copy._stream import stream_copy
from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES
from sgl_core.transfer.copy._turns import timed_turn

__all__ = ["Plan", "backup_path", "backup_slices", "load_steps", "slices_may_copy"]


@dataclasses.dataclass
class Plan:
    """One transfer's runs and what its per-layer loads reuse."""

    runs: IndexRuns
    host_idx: torch.Tensor  # gather indices into the host rows (tokens or pages), CPU
    device_idx: torch.Tensor  # the same on the device side, CPU
    # per part: by-address blocks of one row (host offset, device offset, size), made when needed
    blocks: dict[int, tuple[list[int], list[int], list[int], int]] = dataclasses.field(
        default_factory=dict
    )
    # per (part, row): (device base, host addresses, device addresses)
    addresses: dict[tuple[int, int], tuple[int, list[int], list[int]]] = dataclasses.field(
        default_factory=dict
    )
    staging: dict[tuple[int, int, torch.device], torch.Tensor] = dataclasses.field(
        default_factory=dict
    )
    # per (thread, layer): (the device bases they were built for, the load's steps)
    steps: dict[tuple[int, int], tuple[tuple[int, ...], list[Step]]] = dataclasses.field(
        default_factory=dict
    )
    # the runs in units of the rows' axis 0 (pages where paged), and their ends (host, device)
    unit_runs: list[tuple[int, int, int]] | None = None
    extent: tuple[int, int] = (0, 0)


def _unit_runs(plan: Plan, unit: int) -> list[tuple[int, int, int]]:
    if plan.unit_runs is None:
        runs = [(a // unit, b // unit, n // unit) for a, b, n in plan.runs]
        plan.extent = (
            max((a + n for a, _, n in runs), default=0),
            max((b + n for _, b, n in runs), default=0),
        )
        plan.unit_runs = runs
    return plan.unit_runs


def load_steps(mover: Any, plan: Plan, transfer: Transfer[Any], layer_id: int) -> list[Step]:
    """The copy steps of one layer's load (host -> device) of ``transfer``.

    ``mover`` is the ``DirectMover`` (untyped here: the mover module imports this one,
    and a typed import back would be an import cycle)."""
    tune = mover._tuning(transfer.device_pool)
    threads = tune.copy_threads
    cpu_gather = tune.load_gather_below_run_bytes  # None: gather_below_run_bytes
    cpu_gather = tune.gather_below_run_bytes if cpu_gather is None else cpu_gather
    steps: list[Step] = []
    addrs: tuple[list[int], list[int], list[int]] = ([], [], [])
    for c, part in enumerate(mover.parts):
        r = part.component.slot(layer_id)
        if r is None:
            continue
        layer = mover._device(transfer.device_pool, c)[r]
        run_bytes, block_bytes = mover._sizes(plan, c, transfer.count)
        on_cpu = layer.device.type == "cpu" and part.buffer.device.type == "cpu"
        if block_bytes >= tune.by_address_min_block_bytes and mover._addressable(c, (layer,)):
            hosts, devs, sizes = mover._addresses(plan, c, r, layer)
            for acc, got in zip(addrs, (devs, hosts, sizes), strict=True):  # dst, src, sizes
                acc.extend(got)
        elif run_bytes < (cpu_gather if on_cpu else tune.gather_below_run_bytes):
            dev = mover._device_rows(mover._wide(layer))
            rows = mover._host_rows(c, r)
            # this thread's gather buffer of the part (threads may share a plan)
            key = (threading.get_ident(), c, dev.device)
            staged = plan.staging.get(key)
            if staged is None:
                shape = (plan.host_idx.numel(), *rows.shape[1:])
                staged = torch.empty(shape, dtype=rows.dtype, device=rows.device)
                plan.staging[key] = staged
            if on_cpu:
                steps.append(
                    gather_step(dev, rows, plan.device_idx, plan.host_idx, staged, threads)
                )
                continue
            gather = functools.partial(
                gather_rows, (dev,), (rows,), plan.device_idx, plan.host_idx, out=staged,
                threads=threads,
            )  # fmt: skip
            steps.append(Step(gather, ((),)))
        elif on_cpu:
            host_np = mover.host_np.get((c, r))
            if host_np is None:
                host_np = mover.host_np[(c, r)] = numpy_rows(mover._host_rows(c, r))
            dev_np = numpy_rows(mover._device_rows(mover._wide(layer)))
            runs = _unit_runs(plan, mover.unit if mover.paged else 1)
            steps.append(slices_step(dev_np, host_np, runs, plan.extent, threads))
        else:
            sides = [mover._row_sides(c, r, layer)]
            opts = run_options(tune)
            run = functools.partial(copy_runs, plan.runs, sides, into_first=False, **opts)
            steps.append(Step(run, ((),)))
    if addrs[0]:
        steps.append(memmove_step(addrs[0], addrs[1], addrs[2], threads))
    return steps


def backup_slices(
    mover: Any, plan: Plan, c: int, stacked: torch.Tensor, threads: int, run_bytes: int
) -> tuple[Step, str] | None:
    """A backup of part ``c`` across every row between CPU buffers as numpy run copies
    (one per run, every row at once), and their shape class (``slices_shape``): both
    sides as ``(units, rows, ...)`` views, pages where paged. None (the torch run
    copies) for ``page_head``, off the CPU, with ``copy_threads`` 0 (ATen's threads),
    or for runs of ``SLICES_MAX_RUN_BYTES`` and more where the streaming copy is not a
    candidate (explicit threads, or not loaded): numpy's copies of such runs lose to
    torch's, the streaming copy may not (``backup_path`` measures it)."""
    dev, ps, host = mover._wide(stacked), mover.unit, mover.wide[c]
    if not slices_may_copy(threads, run_bytes * dev.shape[0]) or dev.shape[1] % ps:
        return None
    if not (mover.facts.heads_inner and dev.device.type == host.device.type == "cpu"):
        return None
    if mover.paged:
        dev = dev.view(dev.shape[0], -1, ps, *dev.shape[2:])
    host = host.transpose(0, 1) if mover.facts.rows_outer else host
    runs = [(b, a, n) for a, b, n in _unit_runs(plan, ps)]
    src, dst = numpy_rows(dev.transpose(0, 1)), numpy_rows(host)
    step = slices_step(dst, src, runs, (plan.extent[1], plan.extent[0]), threads, "backup")
    return step, slices_shape(dst, src, runs)[1]


def slices_may_copy(threads: int, run_bytes: int) -> bool:
    """Whether a CPU backup's runs of ``run_bytes`` each across every row (on average)
    may go as a slices step (numpy slice copies, or the streaming copy's table of the
    same runs) with ``copy_threads`` ``threads``: never with ATen's threads (0); runs of
    ``SLICES_MAX_RUN_BYTES`` and more only where the streaming copy is a candidate
    (``AUTO``, loaded): numpy's copies of such runs lose to torch's run copies, the
    streaming copy's may not (``backup_path`` measures which). One rule for every
    backend's stacked backups (core's ``backup_slices``, Ascend's kv-split pairs)."""
    if not threads:
        return False
    return run_bytes < SLICES_MAX_RUN_BYTES or (threads == AUTO and stream_copy() is not None)


def backup_path(
    slices: Step, runs: Callable[[], None], threads: int, shape: str, nbytes: int
) -> Callable[[], None]:
    """How a stacked CPU backup part of ``nbytes`` runs: ``slices`` (numpy run copies)
    or ``runs`` (the torch run copies); both write the same bytes.

    Which one is faster depends on the machine's load (slices never start an OpenMP
    team; torch's run copies win on a quiet machine at some sizes), so with
    ``copy_threads`` AUTO a part of ``AUTO_MIN_BYTES`` or more is decided by the
    calibrator, once per shape (one rank: the faster, no margin either way; a close
    sample confirmed on the first real backups, where the sample's choice stays unless
    the other is more than the rank margin faster), and each call reports its time, so a
    drop (load arriving) measures the shape again.
    Explicit thread counts and small parts keep the slices.
    """
    if threads != AUTO or nbytes < AUTO_MIN_BYTES:
        return slices.run
    # the slices' shape class: a page_first backup (1152-byte pieces) must not inherit
    # the choice a layer_first backup of the same run size made (pieces of a whole run)
    key = f"stacked cpu->cpu {shape}, {_bucket(nbytes)} per backup"
    cal = default_calibrator()
    # one rank: neither is the riskier under load (both choose their own thread counts)
    paths = {"runs": runs, "slices": slices.run}
    ranks = {"runs": 0, "slices": 0}
    chosen = cal.current(key) or cal.choose(key, paths, nbytes, ranks=ranks, confirm=True)

    def observed() -> None:
        ran = cal.turn(key) or chosen  # a close sample is confirmed on the real backups
        timed_turn(cal, key, nbytes, ran, slices.run if ran == "slices" else runs)

    return observed
