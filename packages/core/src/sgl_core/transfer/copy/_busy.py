"""Whether ATen's OpenMP team would find a free core for each of its threads now
(docs/design.md, "Copy threads, calibrated": the busy-core check).

A CPU copy whose calibrated strategy is ``0`` (ATen's own threads) starts an
OpenMP team for each block at or above ATen's grain, and the team's barrier
waits until every one of its threads has run. With a core taken by another
process each block waits for the scheduler: a backup calibrated on a quiet
machine ran at 0.015-0.05x the reference copy beside one busy process, call
after call (issue #27, BENCHMARKS.md). So such a copy asks :func:`team_fits`
before each call, and when the machine lacks the cores it runs the fastest
team-free candidate of the same measurement instead (``Calibrator.skip``).

What counts is the CPU time *other* processes used over the last window
(the machine's busy time from ``/proc/stat`` less this process's own CPU
time): the instantaneous count of runnable tasks would also count the team's
own threads, which spin for a while after each parallel region.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "CoreWatch",
    "LOADAVG",
    "STAT",
    "fits",
    "machine_busy_s",
    "others_fit",
    "runnable",
    "team_fits",
]

#: The kernel's load file: its fourth field is ``running/total`` scheduling entities.
LOADAVG = Path("/proc/loadavg")
#: The kernel's CPU accounting: its first line sums every CPU's time by state.
STAT = Path("/proc/stat")
#: Cores of other processes' use a team still fits beside: more than the idle cores the
#: team needs, by this slack (the window's tick accounting is noisy, BENCHMARKS.md).
SLACK_CORES = 0.3


def runnable(path: Path = LOADAVG) -> int | None:
    """The machine's runnable tasks at this instant, the caller included; None where
    unknown (no procfs, or a file not in ``/proc/loadavg``'s format)."""
    try:
        fields = path.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(fields) < 4:
        return None
    running, slash, _ = fields[3].partition("/")
    return int(running) if slash and running.isdigit() else None


def machine_busy_s(path: Path = STAT, hz: int | None = None) -> float | None:
    """Seconds every CPU of the machine spent busy since boot (user, nice, system,
    irq, softirq and steal: a hypervisor's other guests take the core too); None
    where unknown."""
    try:
        with path.open(encoding="ascii") as f:
            fields = f.readline().split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(fields) < 9 or fields[0] != "cpu" or not all(v.isdigit() for v in fields[1:9]):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    ticks = user + nice + system + irq + softirq + steal
    return ticks / (hz or os.sysconf("SC_CLK_TCK"))


def fits(running: int | None, team: int, cpus: int) -> bool:
    """Whether a team of ``team`` threads started by one of ``running`` runnable tasks
    gets a core per thread: the caller's own core plus ``team - 1`` idle ones.

    A team of one is no team (nothing waits); an unknown count keeps the measured
    choice (the behaviour without this check)."""
    return team <= 1 or running is None or running - 1 + team <= cpus


def others_fit(others: float, team: int, cpus: int) -> bool:
    """Whether a team of ``team`` threads gets a core per thread beside other processes
    that used ``others`` cores on average (within ``SLACK_CORES``)."""
    return team <= 1 or others <= cpus - team + SLACK_CORES


@dataclasses.dataclass(frozen=True)
class _Sample:
    wall: float
    busy: float  # the machine's busy CPU seconds
    own: float  # this process's CPU seconds


@dataclasses.dataclass(eq=False, kw_only=True)
class CoreWatch:
    """The check's state: the last sample and verdict, per process; thread-safe.

    A check at least ``window`` seconds after the last sample judges by the cores
    other processes used between the two (``others_fit``); a sooner one repeats
    the last verdict. With no sample, or one older than ``long`` seconds (no team
    copy ran since, so no team thread of ours still spins), the instantaneous count
    of runnable tasks judges (``fits``). A sample that goes backwards (a forked
    child's CPU time starts at zero) is dropped.
    """

    clock: Callable[[], float] = time.monotonic
    busy: Callable[[], float | None] = machine_busy_s
    own: Callable[[], float] = time.process_time
    running: Callable[[], int | None] = runnable
    window: float = 0.2
    long: float = 1.0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    _last: _Sample | None = dataclasses.field(default=None, init=False)
    _verdict: bool = dataclasses.field(default=True, init=False)

    def team_fits(self, team: int, cpus: int) -> bool:
        """Whether ATen's team of ``team`` threads fits on ``cpus`` CPUs now."""
        if team <= 1:
            return True
        with self._lock:
            now, last = self.clock(), self._last
            if last is not None and now - last.wall < self.window:
                return self._verdict
            busy = self.busy()
            sample = None if busy is None else _Sample(now, busy, self.own())
            if last is None or sample is None or now - last.wall > self.long:
                self._verdict = fits(self.running(), team, cpus)
            elif sample.busy >= last.busy and sample.own >= last.own:
                others = (sample.busy - last.busy - (sample.own - last.own)) / (now - last.wall)
                self._verdict = others_fit(others, team, cpus)
            else:
                sample = None
            self._last = sample
            return self._verdict


_watch = CoreWatch()


def _after_fork_in_child() -> None:
    # the parent's samples count its CPU time, not the child's
    global _watch
    _watch = CoreWatch()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def team_fits() -> bool:
    """Whether ATen's intra-op team (``torch.get_num_threads()``) fits on this machine's
    CPUs now (``CoreWatch.team_fits`` of the process's watch)."""
    return _watch.team_fits(torch.get_num_threads(), os.cpu_count() or 1)
