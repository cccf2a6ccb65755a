"""Whether ATen's OpenMP team would find a free core for each of its threads now
(docs/design.md, "Copy threads, calibrated": the busy-core check).

A CPU copy whose calibrated strategy is ``0`` (ATen's own threads) starts an
OpenMP team for each block at or above ATen's grain, and the team's barrier
waits until every one of its threads has run. With a core taken by another
process each block waits for the scheduler: a backup calibrated on a quiet
machine ran at 0.015-0.05x the reference copy beside one busy process, call
after call (issue #27, BENCHMARKS.md). So such a copy asks :func:`team_fits`
before each call, and when the machine lacks the cores it runs the candidate
the same measurement ranks first without the team instead (``Calibrator.skip``).

What counts is the CPU time *other* processes used over the last window
(the machine's busy time from ``/proc/stat`` less this process's own CPU
time); where no window is known, the tasks runnable now less this process's
own. The team's own threads spin for a while after each parallel region, so
a count that included them would see a quiet machine as busy.
"""

from __future__ import annotations

import contextlib
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
    "TASKS",
    "affinity",
    "fits",
    "machine_busy_s",
    "others_fit",
    "own_running",
    "runnable",
    "settle",
    "team_fits",
]

#: The kernel's load file: its fourth field is ``running/total`` scheduling entities.
LOADAVG = Path("/proc/loadavg")
#: The kernel's CPU accounting: its first line sums every CPU's time by state.
STAT = Path("/proc/stat")
#: This process's threads, a folder each with the thread's ``stat``.
TASKS = Path("/proc/self/task")
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


def machine_busy_s(
    path: Path = STAT, hz: int | None = None, cpus: frozenset[int] | None = None
) -> float | None:
    """Seconds the machine's CPUs (those in ``cpus``, else all) spent busy since boot
    (user, nice, system, irq, softirq and steal: a hypervisor's other guests take the
    core too); None where unknown (no file, another format, a CPU of ``cpus`` missing)."""
    want = {"cpu"} if cpus is None else {f"cpu{c}" for c in cpus}
    ticks, seen = 0, set()
    try:
        with path.open(encoding="ascii") as f:
            for line in f:
                fields = line.split()
                if not fields or not fields[0].startswith("cpu"):
                    break  # the per-CPU lines come first
                if fields[0] not in want:
                    continue
                if len(fields) < 9 or not all(v.isdigit() for v in fields[1:9]):
                    return None
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
                ticks += user + nice + system + irq + softirq + steal
                seen.add(fields[0])
    except (OSError, UnicodeDecodeError):
        return None
    return ticks / (hz or os.sysconf("SC_CLK_TCK")) if seen == want else None


def affinity() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity mask), None where unknown."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _affinity_busy_s() -> float | None:
    return machine_busy_s(cpus=affinity())


def own_running(tasks: Path = TASKS) -> int | None:
    """This process's threads runnable at this instant (state ``R`` in each thread's
    ``stat``), the caller included; None where unknown. It reads a file per thread,
    so only the rare checks without a window ask it."""
    count = 0
    try:
        with os.scandir(tasks) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):  # a thread that just ended
                    stat = Path(entry.path, "stat").read_text(encoding="ascii", errors="replace")
                    fields = stat.rpartition(")")[2].split()
                    count += bool(fields) and fields[0] == "R"
    except OSError:
        return None
    return count or None


def settle(
    limit_s: float = 0.02,
    poll_s: float = 0.0005,
    running: Callable[[], int | None] = own_running,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait until the caller is this process's only running thread, at most ``limit_s``:
    an OpenMP team's workers spin for a few milliseconds after a parallel region (on
    the dev VM, still running 1 ms after it and asleep by 10 ms), so a copy started then
    shares its cores with them. The calibrator runs it untimed before each candidate, so
    no candidate is charged for the one before it. Returns at once where the threads are
    unknown."""
    end = clock() + limit_s
    while (running() or 0) > 1 and clock() < end:
        time.sleep(poll_s)


def fits(running: int | None, team: int, cpus: int, own: int | None = None) -> bool:
    """Whether a team of ``team`` threads gets a core per thread, started by one of
    ``own`` runnable threads of this process (None: the caller alone) among ``running``
    runnable tasks of the machine: the others keep their cores, the team takes its
    caller's and ``team - 1`` more.

    A team of one is no team (nothing waits); an unknown count keeps the measured
    choice (the behaviour without this check). Our own other runnable threads (the
    team's threads spin for a while after each parallel region) leave their cores."""
    mine = max(own or 1, 1)
    return team <= 1 or running is None or max(running - mine, 0) + team <= cpus


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

    A check sooner than ``window`` seconds after the last judgement repeats its
    verdict (nothing is read). A later one judges by the cores other processes
    used since the last sample (``others_fit``: the busy time of the CPUs this
    process may use, less its own CPU time). With no sample, or one older than
    ``long`` seconds, the instantaneous count of runnable tasks judges, less this
    process's own (``fits``, ``own_running``); that count is the whole machine's,
    so beside busy CPUs outside the affinity mask it errs towards skipping the
    team (a slower call, never a stall). A sample that goes backwards (a forked
    child's CPU time starts at zero) is dropped.
    """

    clock: Callable[[], float] = time.monotonic
    busy: Callable[[], float | None] = _affinity_busy_s
    own: Callable[[], float] = time.process_time
    running: Callable[[], int | None] = runnable
    mine: Callable[[], int | None] = own_running
    window: float = 0.2
    long: float = 1.0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    _last: _Sample | None = dataclasses.field(default=None, init=False)
    _at: float | None = dataclasses.field(default=None, init=False)  # the last judgement
    _verdict: bool = dataclasses.field(default=True, init=False)

    def team_fits(self, team: int, cpus: int) -> bool:
        """Whether ATen's team of ``team`` threads fits on ``cpus`` CPUs now."""
        if team <= 1:
            return True
        with self._lock:
            now, last = self.clock(), self._last
            if self._at is not None and now - self._at < self.window:
                return self._verdict
            busy = self.busy()
            sample = None if busy is None else _Sample(now, busy, self.own())
            if last is None or sample is None or now - last.wall > self.long:
                running = self.running()
                own = None if running is None else self.mine()
                self._verdict = fits(running, team, cpus, own)
            elif sample.busy >= last.busy and sample.own >= last.own:
                others = (sample.busy - last.busy - (sample.own - last.own)) / (now - last.wall)
                self._verdict = others_fit(others, team, cpus)
            else:
                sample = None
            self._last, self._at = sample, now
            return self._verdict


_watch = CoreWatch()


def _after_fork_in_child() -> None:
    # the parent's samples count its CPU time, not the child's
    global _watch
    _watch = CoreWatch()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def team_fits(threads: int | None = None, watch: CoreWatch | None = None) -> bool:
    """Whether a team of ``threads`` (default: ATen's intra-op team,
    ``torch.get_num_threads()``) fits on the CPUs this process may use now
    (``CoreWatch.team_fits`` of ``watch``, default the process's watch); True where their
    number is unknown (the measured choice runs)."""
    mask = affinity()
    cpus = len(mask) if mask else os.cpu_count()
    count = torch.get_num_threads() if threads is None else threads
    return not cpus or (watch or _watch).team_fits(count, cpus)
