"""Which CUDA copy path moves a transfer: ``SGL_CUDA_DIRECT_COPY``, or ``auto``'s measured choice.

The candidates (each bit-exact, each declining by copying nothing and
returning False), their preference order, the keys and the re-measuring are
described in docs/design.md section 6 ("CUDA copy paths, calibrated").
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping

import torch

from sgl_core.backend import Calibrator, default_calibrator
from sgl_core.errors import ShapeMismatchError

__all__ = [
    "CANDIDATES",
    "MODES",
    "MOVER_MODES",
    "Candidate",
    "PathChooser",
    "device_label",
    "path_key",
    "resolve_mode",
    "size_class",
]

MODES = ("batch", "batch-plain", "foreach")
#: The host pools' ``direct`` movers also take ``auto``: the path chosen by measurement.
MOVER_MODES = (*MODES, "auto")
_ENV = "SGL_CUDA_DIRECT_COPY"
#: Every candidate name, in preference order.
CANDIDATES = ("copy engine", "copy engine gather", "batched copy engine", "kernel")
#: Moves the transfer and returns True, or declines: returns False having copied nothing.
Candidate = Callable[[], bool]


def resolve_mode(mode: str | None, *, movers: bool = False) -> str:
    """``mode``, else ``$SGL_CUDA_DIRECT_COPY``, else ``foreach``; checked against MODES
    (``movers``: MOVER_MODES, which add ``auto``).

    ``foreach`` stays the default until the batched modes have run on a GPU
    (``scripts/gpu_check.sh`` measures and tests all of them); ``batch`` and
    ``auto`` are opt-in.
    """
    chosen = mode if mode is not None else os.environ.get(_ENV, "").strip().lower() or "foreach"
    allowed = MOVER_MODES if movers else MODES
    if chosen not in allowed:
        raise ShapeMismatchError(f"direct copy mode must be one of {allowed}, got {chosen!r}")
    return chosen


def size_class(nbytes: int) -> str:
    """The power-of-two class of a size: ``64KiB``, ``512B``."""
    size = 1 << max(nbytes, 1).bit_length() - 1
    return f"{size >> 10}KiB" if size >= 1024 else f"{size}B"


def device_label(device: torch.device) -> str:
    """``cpu``, or ``cuda:N (<GPU name>)``: a cached choice applies only to the same GPU."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def path_key(
    op: str, host: torch.device, device: torch.device, layout: str, parts: str, run: int
) -> str:
    """The calibration key of one kind of transfer: ``parts`` names the components moved
    (``kv``; ``k,v``; with an indexer's), ``run`` is the average bytes of one row's run."""
    pair = (host, device) if op == "load" else (device, host)
    return (
        f"cuda {op} {device_label(pair[0])}->{device_label(pair[1])} {layout} [{parts}] "
        f"{size_class(run)} runs"
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(candidate: Candidate, device: torch.device) -> None:
    """One measured run: the copy and, on a GPU, its completion."""
    candidate()
    _synchronize(device)


class PathChooser:
    """Runs a transfer with the candidate measured fastest for its key.

    ``calibrator`` None: the process's (``default_calibrator()``), read at
    each use (tests swap it). Candidates must not ask a calibrator
    themselves (it holds its lock while it measures).
    """

    def __init__(self, calibrator: Calibrator | None = None) -> None:
        self._calibrator = calibrator
        self._lock = threading.Lock()
        # key -> CUDA events around its last real copy, read at its next call
        self._pending: dict[str, tuple[torch.cuda.Event, torch.cuda.Event, int]] = {}

    @property
    def calibrator(self) -> Calibrator:
        return self._calibrator if self._calibrator is not None else default_calibrator()

    def run(
        self,
        key: str,
        candidates: Mapping[str, Candidate],
        nbytes: int,
        device: torch.device,
        sample: Callable[[], tuple[Mapping[str, Candidate], int] | None] | None = None,
    ) -> str:
        """Move the transfer with the chosen candidate; the name of the one that moved it.

        ``candidates`` move the whole transfer (``nbytes``), the first one
        never declines. An unknown or stale key is measured first on what
        ``sample()`` returns (the same candidates over a part of the transfer,
        and its bytes; built only to measure), or on the whole transfer
        (None): each candidate runs once (those that decline drop out), then
        the calibrator times the rest.
        """
        cal = self.calibrator
        chosen = cal.current(key)
        if chosen is None or chosen not in candidates:
            return self._measure(cal, key, candidates, nbytes, device, sample)
        with self._lock:  # the key's previous GPU copy, reported if its events are done
            pending = self._pending.pop(key, None)
        if pending is not None and pending[1].query():  # type: ignore[no-untyped-call]
            start_event, end_event, copied = pending
            cal.observe(key, copied, start_event.elapsed_time(end_event) / 1e3)
        start: torch.cuda.Event | float
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
        else:
            start = cal.timer()
        if not candidates[chosen]():
            return self._fallback(candidates, next(iter(candidates)))
        if isinstance(start, torch.cuda.Event):
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record()
            with self._lock:  # read at the key's next call, so nothing waits for the copy
                self._pending[key] = (start, end, nbytes)
        else:
            cal.observe(key, nbytes, cal.timer() - start)
        return chosen

    # ----------------------------------------------------------- internals
    @staticmethod
    def _fallback(candidates: Mapping[str, Candidate], first: str) -> str:
        """The chosen candidate declined this call (e.g. switched off): the first one moves it."""
        if not candidates[first]():
            raise RuntimeError(f"internal error: the first copy candidate ({first}) declined")
        return first

    def _measure(
        self,
        cal: Calibrator,
        key: str,
        candidates: Mapping[str, Candidate],
        nbytes: int,
        device: torch.device,
        sample: Callable[[], tuple[Mapping[str, Candidate], int] | None] | None,
    ) -> str:
        part = sample() if sample is not None else None
        trial, trial_bytes = part if part is not None else (candidates, nbytes)
        # Each candidate once: a decline copies nothing and drops out; the others are
        # timed. Copies are idempotent and bit-exact, so the bytes are right whichever ran last.
        usable = [name for name, candidate in trial.items() if candidate()]
        if not usable or usable[0] != next(iter(trial)):
            raise RuntimeError("internal error: the first copy candidate declined")
        _synchronize(device)
        timed = {name: functools.partial(_timed, trial[name], device) for name in usable}
        chosen = cal.choose(key, timed, trial_bytes)
        # the sample was a part: the chosen one moves the whole
        if part is not None and not candidates[chosen]():
            return self._fallback(candidates, next(iter(candidates)))
        return chosen
