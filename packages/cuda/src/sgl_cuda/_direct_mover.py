"""The cuda host pools' ``direct`` mover, one for every kind of KV rows.

``CudaDirectMover`` is the core ``DirectMover`` recording the point after each
transfer in the pool's ``StreamFence``; ``SGL_CUDA_DIRECT_COPY`` picks how it
copies (docs/design.md section 6, "CUDA copy paths, calibrated").
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from sgl_core.backend import (
    NEVER,
    CopyTuning,
    DirectMover,
    HostLayout,
    HostSide,
    PlanCache,
    Transfer,
    finish,
    merge_runs,
    tuning_for,
)
from sgl_core.errors import SGLError
from sgl_cuda import _copy_engine
from sgl_cuda._kernels import StreamFence
from sgl_cuda._movers import KernelMover
from sgl_cuda._path_choice import Candidate, PathChooser, path_key, resolve_mode

__all__ = ["SAMPLE_BYTES", "CudaDirectMover"]

# The layouts whose host rows the copy engine's entry points address.
_BATCHED = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST_DIRECT)
#: ``auto`` measures a new kind of transfer on about this many bytes of it.
SAMPLE_BYTES = 8 << 20
_CHOOSER = PathChooser()
_CPU = torch.device("cpu")


def _moved(mover: Any, transfer: Transfer[Any], layer_id: int | None) -> bool:
    if layer_id is None:
        mover.backup(transfer)
    else:
        mover.load(transfer, layer_id)
    return True


@dataclasses.dataclass(frozen=True)
class _AutoPlan:
    """What ``auto`` keeps of a validated transfer: its run size and kernel candidate."""

    run_bytes: int  # average bytes of one row's run
    kernel: KernelMover | None


class CudaDirectMover(DirectMover):
    """``direct`` io (core slice copies), recording each transfer in the pool's fence."""

    #: ``auto``'s chooser (tests give a mover one on a fake clock).
    chooser: PathChooser = _CHOOSER

    def __init__(self, host: HostSide, fence: StreamFence | None = None) -> None:
        super().__init__(host)
        self.fence = StreamFence() if fence is None else fence
        self.side = host
        # Rows kept on a layer subset (the DSA indexer) are addressed by slot, which
        # the copy engine's per-layer entry points do not know: the slices move them.
        self._subset = any(p.component.layers is not None for p in self.parts)
        self._names = ",".join(p.component.name for p in self.parts)  # part of auto's keys
        self._pinned: dict[tuple[torch.device, int], DirectMover] = {}
        self._kernel: KernelMover | None = None  # auto's kernel candidate, built on first use
        self._auto_plans: PlanCache[_AutoPlan] = PlanCache()

    def synchronize(self) -> None:
        self.fence.synchronize()

    def backup(self, transfer: Transfer[Any]) -> None:
        mode = resolve_mode(None, movers=True)
        if mode == "auto" and self.tuning is None:
            self._auto(transfer, None)
        elif mode == "auto" or not self._batched(transfer, None, mode):
            super().backup(transfer)
        self.fence.record(transfer.device_pool.device)

    def load(self, transfer: Transfer[Any], layer_id: int) -> None:
        mode = resolve_mode(None, movers=True)
        if mode == "auto" and self.tuning is None:
            self._auto(transfer, layer_id)
        elif mode == "auto" or not self._batched(transfer, layer_id, mode):
            # The core load's steps run here (not through super().load): the
            # copy primitive stays one frame below this method.
            for step in self.bound_steps(transfer, layer_id):
                rest = step.start_rest()
                try:
                    step.fn(*step.parts[0])
                finally:
                    finish(rest)
        self.fence.record(transfer.device_pool.device)

    # ----------------------------------------------------------- batched
    def _batched(
        self, transfer: Transfer[Any], layer_id: int | None, mode: str, short: int | None = None
    ) -> bool:
        """One batched copy-engine call (opt-in), or False with nothing copied.

        ``short``: runs averaging fewer bytes decline (None: the tuning's gather limit).
        """
        if mode == "foreach" or self.layout not in _BATCHED or self._subset:
            return False
        pool = transfer.device_pool
        h_idx, d_idx = transfer.host_indices.cpu(), transfer.device_indices.cpu()
        every = range(self.layer_num) if layer_id is None else range(layer_id, layer_id + 1)
        devs = [[getattr(pool, p.component.device_name)[r] for r in every] for p in self.parts]
        if self.layout is HostLayout.PAGE_FIRST_DIRECT:
            parts = [(p.buffer, d) for p, d in zip(self.parts, devs, strict=True)]
            return _copy_engine.page_first(
                parts, every.start, h_idx, d_idx, self.unit, mode, to_host=layer_id is None
            )
        hosts = [self.facts.row(p.buffer, r) for p in self.parts for r in every]
        flat = [t for d in devs for t in d]
        if short is None:
            short = self._tuning(pool).gather_below_run_bytes
        if layer_id is None:
            return _copy_engine.layer_first(flat, hosts, d_idx, h_idx, mode, short)
        return _copy_engine.layer_first(hosts, flat, h_idx, d_idx, mode, short)

    # -------------------------------------------------------------- auto
    def _auto(self, transfer: Transfer[Any], layer_id: int | None) -> None:
        """The measured path (``sgl_cuda._path_choice``) moves the transfer."""
        # A load's plan is kept for the transfer's next layers (no index read-back per
        # layer); a backup plans afresh and leaves the loads' plan in place.
        if layer_id is None:
            plan = self._auto_plan(transfer)
        else:
            plan = self._auto_plans.get(transfer, self._auto_plan)
        device = transfer.device_pool.device
        count = transfer.count
        op = "backup" if layer_id is None else "load"
        key = path_key(op, _CPU, device, self.layout.value, self._names, plan.run_bytes)
        nbytes = sum(self.rows) * count * (self.layer_num if layer_id is None else 1)

        def sample() -> tuple[dict[str, Candidate], int] | None:
            # index pairs of about SAMPLE_BYTES (whole pages); None: the whole transfer
            take = max(1, count * SAMPLE_BYTES // max(nbytes, 1))
            take = -(-take // self.unit) * self.unit
            if nbytes <= SAMPLE_BYTES or take >= count:
                return None
            part = dataclasses.replace(
                transfer,
                host_indices=transfer.host_indices[:take],
                device_indices=transfer.device_indices[:take],
            )
            return self._candidates(part, layer_id, plan.kernel), nbytes * take // count

        cands = self._candidates(transfer, layer_id, plan.kernel)
        self.chooser.run(key, cands, nbytes, device, sample)

    def _auto_plan(self, transfer: Transfer[Any]) -> _AutoPlan:
        unit = self.unit
        runs = merge_runs(
            transfer.host_indices[::unit].to("cpu"),
            transfer.device_indices[::unit].to("cpu"),
            unit=unit,
        )
        run_bytes = self.rows[0] * transfer.count // max(len(runs), 1)
        # The ``kernel`` candidate only for ``layer_first`` (the kernels have no address
        # form for ``page_first_direct``), whose pools refuse rows that are not whole
        # 8-byte words when they are built; the device pool is checked as for ``kernel`` io.
        if self.layout is not HostLayout.LAYER_FIRST:
            return _AutoPlan(run_bytes, None)
        kernel = self._kernel
        if kernel is None:
            # one thread for its indexer rows between CPU buffers: no calibrator inside a candidate
            tune = dataclasses.replace(tuning_for(transfer.device_pool.device), copy_threads=1)
            side = dataclasses.replace(self.side, tuning=tune)
            kernel = self._kernel = KernelMover(side, self.fence)
        try:
            kernel.check(transfer.device_pool)  # unpinned host memory; a CPU pool, no interpreter
        except SGLError:
            return _AutoPlan(run_bytes, None)
        return _AutoPlan(run_bytes, kernel)

    def _candidates(
        self, transfer: Transfer[Any], layer_id: int | None, kernel: KernelMover | None
    ) -> dict[str, Candidate]:
        device = transfer.device_pool.device
        cands: dict[str, Candidate] = {
            "copy engine": functools.partial(
                _moved, self._pinned_mover(device, 0), transfer, layer_id
            ),
            "copy engine gather": functools.partial(
                _moved, self._pinned_mover(device, NEVER), transfer, layer_id
            ),
            "batched copy engine": functools.partial(self._batched, transfer, layer_id, "batch", 0),
        }
        if kernel is not None:
            cands["kernel"] = functools.partial(_moved, kernel, transfer, layer_id)
        return cands

    def _pinned_mover(self, device: torch.device, gather_below: int) -> DirectMover:
        """A core mover whose tuning pins the per-piece path (slices, or gather below NEVER).

        One thread between CPU buffers: a candidate never asks the calibrator itself.
        """
        mover = self._pinned.get((device, gather_below))
        if mover is None:
            tune: CopyTuning = dataclasses.replace(
                tuning_for(device), gather_below_run_bytes=gather_below, copy_threads=1
            )
            mover = DirectMover(dataclasses.replace(self.side, tuning=tune))
            self._pinned[(device, gather_below)] = mover
        return mover
