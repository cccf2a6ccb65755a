"""The streaming copy on several threads for a kept table (a per-layer load's step): a
team of helper threads that wait for the next call spinning in machine code, instead of
the copy threads' pool, whose threads sleep between calls (docs/design.md, "The streaming
team").

A per-layer load is a call of a few hundred microseconds. Handing part of it to a pool
thread asleep on a futex costs that thread's wake-up on every call, and a fixed half
then ends late by as much (BENCHMARKS.md, "The streaming team"). Here the call is posted
in a box and cut into parts (``team_bounds``) that the calling thread (the lead) and the
helpers take one at a time (``_team_code``): a helper that is still asleep or not
scheduled takes nothing and holds nothing up. A helper spins for ``SERVE_PAUSES``
``pause`` instructions after each call, then sleeps until a lead wakes it; the lead spins
for ``WAIT_PAUSES`` for the parts it did not take, then naps ``NAP_S`` at a time (a
helper preempted mid-part gets a core). Spinning pays only with a core per thread: where
other processes take the cores (the busy-core check, ``_busy``) a call copies on its own
thread; where another thread leads the team (one lead at a time) it shares its table over
the pool (``stream_shared``), whose threads sleep until woken.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import threading
import time
from typing import Any

import numpy as np

from sgl_core.transfer.copy import _busy, _copy, _stream, _stream_gather
from sgl_core.transfer.copy._pieces import split_parts
from sgl_core.transfer.copy._team_code import BOX_WORDS, TEAM

__all__ = [
    "NAP_S",
    "PARTS_PER_THREAD",
    "SERVE_PAUSES",
    "Team",
    "WAIT_PAUSES",
    "stream_team",
    "team_bounds",
    "team_calls",
    "team_each",
]

#: a helper's spin for the next call before it sleeps: a per-layer load's next layer
#: comes tens of microseconds after the last, but a calibration's trial runs the other
#: candidates in between, and a helper woken from its sleep joins late for a dozen calls
#: more (BENCHMARKS.md, "The streaming team")
SERVE_PAUSES = 80000
#: the lead's spin for the parts it did not take, before it naps ``NAP_S`` at a time
WAIT_PAUSES = 4000
NAP_S = 50e-6
#: a call's parts per thread: a late helper leaves the lead less to wait for
PARTS_PER_THREAD = 2

_WORK, _GATHER = 0, 6  # the box's words (``_team_code``)
_U64 = ctypes.c_uint64


class _Helper:
    """One helper thread, seat ``seat`` (1, 2, ...), asleep on ``bell`` between spins."""

    def __init__(self, team: Team, seat: int) -> None:
        self.team, self.seat = team, seat
        self.asleep = False
        self.bell = threading.Semaphore(0)
        name = f"sgl-stream-{seat}"
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def wake(self) -> None:
        if self.asleep:
            self.asleep = False
            self.bell.release()

    def _run(self) -> None:
        team, seen = self.team, 0
        while not team.stopped:
            seen = team.serve(team.addr, seen, SERVE_PAUSES, self.seat)
            self.asleep = True
            # a call posted since ``serve`` returned is served now, not slept through
            if team.box[_WORK] >> 32 == seen and not team.stopped:
                self.bell.acquire()
            self.asleep = False


class Team:
    """The box (``_team_code``), its helper threads and the lead's lock."""

    def __init__(self, page: int, gather: int) -> None:
        self.lead: Any = ctypes.CFUNCTYPE(_U64, *[_U64] * 6)(page + TEAM.lead)
        self.wait: Any = ctypes.CFUNCTYPE(_U64, _U64, _U64)(page + TEAM.wait)
        self.serve: Any = ctypes.CFUNCTYPE(_U64, _U64, _U64, _U64, _U64)(page + TEAM.serve)
        self.box = (_U64 * BOX_WORDS)()
        self.box[_GATHER] = gather
        self.addr = ctypes.addressof(self.box)
        self.lock = threading.Lock()
        self.helpers: list[_Helper] = []
        self.stopped = False

    def run(self, ops: np.ndarray[Any, Any], bounds: np.ndarray[Any, Any], threads: int) -> bool:
        """Copy ``ops``'s parts (``bounds``, checked by the caller) here and on up to
        ``threads - 1`` helpers; False, with nothing copied, while another thread leads."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            while len(self.helpers) < threads - 1:
                self.helpers.append(_Helper(self, len(self.helpers) + 1))
            for helper in self.helpers[: threads - 1]:
                helper.wake()
            parts = bounds.shape[0] - 1
            busy = self.lead(
                self.addr, ops.ctypes.data, bounds.ctypes.data, parts, threads, WAIT_PAUSES
            )
            try:
                while busy:
                    time.sleep(NAP_S)
                    busy = self.wait(self.addr, WAIT_PAUSES)
            finally:
                while busy:  # interrupted: every part taken ends before the box is reused
                    busy = self.wait(self.addr, WAIT_PAUSES)
        finally:
            self.lock.release()
        return True

    def stop(self) -> None:
        """End the helper threads (each within its spin); the team is not used again."""
        with self.lock:
            self.stopped = True
            for helper in self.helpers:
                helper.bell.release()
            for helper in self.helpers:
                helper.thread.join()


_lock = threading.Lock()
_team: Team | str | None = None  # the team, why there is none, or not yet asked


def stream_team() -> Team | None:
    """The process's team, started at first use; None where the streaming copy is not
    loaded or the team's code cannot be mapped."""
    global _team
    gather = _stream.stream_copy()
    with _lock:
        if _team is None and gather is not None:
            page = _stream.map_page(ctypes.CDLL(None, use_errno=True), TEAM.code)
            raw: Any = gather  # a ctypes function pointer (typed as the callable it is)
            address = ctypes.cast(raw, ctypes.c_void_p).value
            _team = page if isinstance(page, str) else Team(page, int(address or 0))
        return _team if isinstance(_team, Team) else None


def team_bounds(entries: int, threads: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The part bounds of a table of ``entries`` on ``threads`` threads: ``[0, ..., entries]``
    in ``PARTS_PER_THREAD * threads`` nearly equal parts (fewer for a short table; none,
    ``[0]``, for an empty one)."""
    cuts = split_parts(entries, PARTS_PER_THREAD * threads)
    return np.array([0, *(b for _, b in cuts)], dtype=np.uint64)


def team_each(
    ops: np.ndarray[Any, np.dtype[np.uint64]],
    bounds: np.ndarray[Any, np.dtype[np.uint64]],
    threads: int,
) -> None:
    """Copy every (dst, src, len) row of ``ops`` (as ``_stream.stream_each``) on ``threads``
    threads, the team's parts cut at ``bounds`` (``team_bounds``)."""
    if bounds.dtype != np.uint64 or bounds.ndim != 1 or not bounds.flags.c_contiguous:
        raise ValueError(f"bounds must be a contiguous uint64 vector, got {bounds.dtype}")
    if bounds.shape[0] < 1 or bounds[0] != 0 or int(bounds[-1]) != ops.shape[0]:
        raise ValueError(f"bounds must run from 0 to the table's {ops.shape[0]} rows")
    if bool((bounds[1:] < bounds[:-1]).any()):
        raise ValueError("bounds must not decrease")
    gather = _stream.check_table(ops)
    if threads < 2:
        gather(ops.ctypes.data, ops.shape[0])
        return
    team = stream_team()
    if team is None:
        way = "none"
    elif not _quiet(threads):
        way = "busy"
    else:
        way = "team" if team.run(ops, bounds, threads) else "led"
    with _lock:
        _calls[way] += 1
    if way == "busy":  # no core for a second thread: one thread beats two that wait
        gather(ops.ctypes.data, ops.shape[0])
    elif way != "team":
        _stream_gather.stream_shared(ops, threads, _stream.stream_each)


#: calls of ``team_each`` on several threads by the way they went: on the ``team``; on
#: this thread alone with the cores ``busy``; over the pool with the team ``led`` by
#: another thread, or ``none``
_calls = dict.fromkeys(("team", "busy", "led", "none"), 0)


def team_calls() -> dict[str, int]:
    """How many calls on several threads went each way since the process started
    (``sgl-bench hicache`` prints each phase's)."""
    with _lock:
        return dict(_calls)


_watches: dict[int, _busy.CoreWatch] = {}  # per thread count: a verdict is for one count


def _quiet(threads: int) -> bool:
    """Whether a team of ``threads`` gets a core per thread now: the busy-core check by
    the cores other processes used since its last sample, however long ago (a pause
    between calls is a window too). Without a sample (the first call) it says yes: the
    instantaneous count of runnable tasks counts any task that happens to run at that
    instant, and its no would hold for a whole window (a real-call trial of the team
    would time the pool)."""
    watch = _watches.get(threads)
    if watch is None:
        watch = _busy.CoreWatch(running=_unknown, long=math.inf)
        watch = _watches.setdefault(threads, watch)
    return _busy.team_fits(threads, watch)


def _unknown() -> None:
    return None


def _stop_team() -> None:
    global _team
    with _lock:
        team, _team = _team, None
    if isinstance(team, Team):
        team.stop()


def _after_fork_in_child() -> None:
    # the parent's helpers do not exist in a forked child: it starts a team of its own
    global _team, _lock
    _team, _lock = None, threading.Lock()
    _watches.clear()  # the parent's samples count its CPU time, not the child's
    _calls.update(dict.fromkeys(_calls, 0))


_copy.at_shutdown(_stop_team)
atexit.register(_stop_team)  # no helper spins on a box the interpreter is tearing down
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
