"""The busy-core check (issue #27): a copy calibrated to ATen's OpenMP team (``0``)
runs the fastest team-free candidate of the same measurement while the machine has
no free core for every thread of the team.

No timed assertions: the machine's load is scripted (``/proc/loadavg`` files, a
patched ``team_fits``); real copies are checked for their bytes and for which
thread count ran.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch

from sgl_core.transfer.copy import _auto_copy, _busy, _calibrate
from sgl_core.transfer.copy._auto_copy import _bucket, thread_ranks
from sgl_core.transfer.copy._busy import (
    CoreWatch,
    fits,
    machine_busy_s,
    others_fit,
    own_running,
    runnable,
    settle,
    team_fits,
)
from sgl_core.transfer.copy._calibrate import Calibrator, CopyChoice
from sgl_core.transfer.copy._copy import copy_blocks, memmove_blocks
from sgl_core.transfer.copy._engine import gather_rows


# ------------------------------------------------------------ settle
class _Ticks:
    """A fake monotonic clock that the fake ``time.sleep`` advances (sleeps recorded)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(
    ("counts", "sleeps"),
    [
        ([3, 2, 1], 2),  # the team's workers fall asleep after two polls
        ([1], 0),  # only the caller runs: no wait
        ([None], 0),  # threads unknown: no wait
        ([2] * 100, 40),  # they keep running: at most limit_s (0.02 s in 0.5 ms polls)
    ],
)
def test_settle_waits_until_the_caller_runs_alone_at_most_its_limit(
    monkeypatch: pytest.MonkeyPatch, counts: list[int | None], sleeps: int
) -> None:
    ticks = _Ticks()
    monkeypatch.setattr("sgl_core.transfer.copy._busy.time.sleep", ticks.sleep)
    seen = iter(counts)
    settle(running=lambda: next(seen), clock=lambda: ticks.now)
    assert ticks.sleeps == [0.0005] * sleeps


def test_settle_stops_polling_at_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = _Ticks()
    ticks.now = 0.0
    monkeypatch.setattr("sgl_core.transfer.copy._busy.time.sleep", ticks.sleep)
    settle(limit_s=0.5, poll_s=0.25, running=lambda: 2, clock=lambda: ticks.now)
    assert ticks.sleeps == [0.25, 0.25]  # at 0.5 s the limit is reached: no third poll


# ------------------------------------------------------------ the load file
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0.38 0.10 0.03 3/123 4567\n", 3),
        ("1.00 1.00 1.00 17/900 1", 17),
        ("", None),
        ("0.38 0.10 0.03", None),  # too few fields
        ("0.38 0.10 0.03 7 123", None),  # no "running/total"
        ("0.38 0.10 0.03 x/123 4567", None),
        ("0.38 0.10 0.03 /123 4567", None),
        ("0.38 0.10 0.03 -2/123 4567", None),
        ("0.38 0.10 0.03 3/123", 3),  # the fifth field (last pid) is not needed
        ("0.38 0.10 0.03 2/3/4 5", 2),  # the count before the first slash
        ("0.38 0.10 0.03 \u0663/123 4567", None),  # a digit, but not ASCII
    ],
)
def test_runnable_reads_the_fourth_field(tmp_path: Path, text: str, want: int | None) -> None:
    path = tmp_path / "loadavg"
    path.write_text(text, encoding="utf-8")
    assert runnable(path) == want


def test_an_unreadable_load_file_is_unknown(tmp_path: Path) -> None:
    assert runnable(tmp_path / "missing") is None
    odd = tmp_path / "loadavg"
    odd.write_bytes(b"0.1 0.1 0.1 \xff2/3 4")
    assert runnable(odd) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs")
def test_this_machine_counts_at_least_the_caller() -> None:
    got = runnable()
    assert got is not None and got >= 1


@pytest.mark.parametrize(
    ("running", "team", "cpus", "want"),
    [
        (1, 2, 2, True),  # quiet: the caller's core and one idle core
        (2, 2, 2, False),  # one busy process: the team's second thread waits
        (3, 2, 4, True),
        (4, 2, 4, False),
        (5, 4, 8, True),
        (6, 4, 8, False),
        (9, 1, 2, True),  # one thread is no team
        (None, 8, 2, True),  # unknown: keep the measured choice
        (0, 2, 2, True),
    ],
)
def test_fits(running: int | None, team: int, cpus: int, want: bool) -> None:
    assert fits(running, team, cpus) is want
    assert fits(running, team, cpus, 1) is want and fits(running, team, cpus, 0) is want


@pytest.mark.parametrize(
    ("running", "own", "want"),
    [
        (2, 2, True),  # our team's second thread still spins: no other task
        (3, 2, False),  # ... and one busy process
        (4, 3, False),
        (3, 3, True),
    ],
)
def test_fits_leaves_out_our_own_threads(running: int, own: int, want: bool) -> None:
    assert fits(running, 2, 2, own) is want


def _task(root: Path, tid: int, stat: str | None) -> None:
    folder = root / str(tid)
    folder.mkdir()
    if stat is not None:
        (folder / "stat").write_text(stat, encoding="ascii")


def test_own_running_counts_runnable_threads(tmp_path: Path) -> None:
    _task(tmp_path, 10, "10 (python) R 1 2 3")
    _task(tmp_path, 11, "11 (a) R (b)) S 1 2 3")  # a name with ") R (": the state after it
    _task(tmp_path, 12, "12 (pt_main) R 1 2")
    _task(tmp_path, 13, "13 (w) D 1 2")
    _task(tmp_path, 14, None)  # a thread that ended
    _task(tmp_path, 15, "15 (odd)")
    _task(tmp_path, 16, None)
    (tmp_path / "16" / "stat").write_bytes(b"16 (bad\xffname) R 1 2")  # any bytes in a name
    assert own_running(tmp_path) == 3
    assert own_running(tmp_path / "missing") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert own_running(empty) is None  # not even the caller: unknown


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs")
def test_this_process_runs_at_least_the_caller() -> None:
    got = own_running()
    assert got is not None and got >= 1


def test_team_fits_asks_torch_and_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, int]] = []

    class Watch:
        def team_fits(self, team: int, cpus: int) -> bool:
            asked.append((team, cpus))
            return team == 3

    monkeypatch.setattr(_busy, "_watch", Watch())
    monkeypatch.setattr(_busy, "affinity", lambda: frozenset({0, 5, 7}))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert team_fits()
    monkeypatch.setattr(_busy, "affinity", lambda: None)  # no mask: every CPU
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not team_fits()
    assert asked == [(3, 3), (2, 64)]
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # nothing known: the choice runs
    assert team_fits() and len(asked) == 2


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="affinity masks")
def test_affinity_is_this_process_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _busy.affinity() == frozenset(os.sched_getaffinity(0))

    def refuse(pid: int) -> set[int]:
        raise OSError("no")

    monkeypatch.setattr(os, "sched_getaffinity", refuse)
    assert _busy.affinity() is None
    masks = {0: {1}, 1: {0, 1, 2}}  # this process (pid 0: the caller), and init
    monkeypatch.setattr(os, "sched_getaffinity", masks.__getitem__)
    assert _busy.affinity() == frozenset({1})


def test_the_watch_reads_the_busy_time_of_the_affinity_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[frozenset[int] | None] = []

    def busy(cpus: frozenset[int] | None = None) -> float:
        asked.append(cpus)
        return 1.0

    monkeypatch.setattr(_busy, "affinity", lambda: frozenset({3}))
    monkeypatch.setattr(_busy, "machine_busy_s", busy)
    assert _busy._affinity_busy_s() == 1.0 and asked == [frozenset({3})]


def test_the_fork_hook_starts_a_new_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = CoreWatch()
    monkeypatch.setattr(_busy, "_watch", parent)
    _busy._after_fork_in_child()
    assert isinstance(_busy._watch, CoreWatch) and _busy._watch is not parent


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_a_watch_of_its_own() -> None:
    parent = _busy._watch
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running anything of pytest's
        fresh = isinstance(_busy._watch, CoreWatch) and _busy._watch is not parent
        os.write(write, b"new" if fresh else b"same")
        os._exit(0)
    os.close(write)
    got = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    assert got == b"new" and _busy._watch is parent


# ------------------------------------------------------------- /proc/stat
@pytest.mark.parametrize(
    ("text", "want"),
    [
        # user nice system idle iowait irq softirq steal guest guest_nice
        ("cpu  100 20 30 400 50 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\n", 1.71),
        ("cpu 100 20 30 400 50 6 7 8\n", 1.71),  # older kernels: no guest fields
        ("cpu0 100 20 30 400 50 6 7 8\n", None),  # not the all-CPU line
        ("cpu 100 20 30 400 50 6 7\n", None),  # too few fields
        ("cpu 100 20 x 400 50 6 7 8\n", None),
        ("cpu x 20 30 400 50 6 7 8\n", None),
        ("cpu 100 20 30 400 50 6 7 8 guest?\n", 1.71),  # fields past steal are not read
        ("cpu \u0661 20 30 400 50 6 7 8\n", None),  # a digit, but not ASCII
        ("", None),
    ],
)
def test_machine_busy_counts_busy_states(tmp_path: Path, text: str, want: float | None) -> None:
    path = tmp_path / "stat"
    path.write_text(text, encoding="utf-8")
    got = machine_busy_s(path, hz=100)
    assert got == (None if want is None else pytest.approx(want))


def test_machine_busy_sums_the_cpus_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    path.write_text(
        "cpu  9 9 9 9 9 9 9 9 0 0\n"
        "cpu0 100 0 0 5 5 0 0 0 0 0\n"
        "cpu1 10 1 2 5 5 3 4 5 0 0\n"
        "cpu2 7 0 0 5 5 0 0 0 0 0\n"
        "intr 1 2 3\n"
        "cpu3 1000 0 0 0 0 0 0 0\n",  # past the CPU lines: not read
        encoding="ascii",
    )
    assert machine_busy_s(path, hz=100, cpus=frozenset({1, 2})) == pytest.approx(0.32)
    assert machine_busy_s(path, hz=100, cpus=frozenset({0})) == pytest.approx(1.0)
    assert machine_busy_s(path, hz=100, cpus=frozenset({2, 3})) is None  # cpu3 not listed
    path.write_text("cpu 1 1 1 1 1 1 1 1\ncpu0 1 2 3\n", encoding="ascii")
    assert machine_busy_s(path, hz=100, cpus=frozenset({0})) is None  # a short line


def test_an_unreadable_stat_file_is_unknown(tmp_path: Path) -> None:
    assert machine_busy_s(tmp_path / "missing", hz=100) is None
    odd = tmp_path / "stat"
    odd.write_bytes(b"cpu 1 2 3 4 5 6 7 \xff8\n")
    assert machine_busy_s(odd, hz=100) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs")
def test_this_machine_has_been_busy() -> None:
    got = machine_busy_s()
    assert got is not None and got > 0


@pytest.mark.parametrize(
    ("others", "team", "cpus", "want"),
    [
        (0.0, 2, 2, True),
        (0.3, 2, 2, True),  # the slack: tick accounting is noisy
        (0.31, 2, 2, False),
        (1.0, 2, 2, False),  # one busy process on a 2-core machine
        (2.3, 4, 8, True),
        (4.31, 4, 8, False),
        (8.0, 1, 2, True),  # one thread is no team
    ],
)
def test_others_fit(others: float, team: int, cpus: int, want: bool) -> None:
    assert others_fit(others, team, cpus) is want


# --------------------------------------------------------------- CoreWatch
class Machine:
    """A scripted machine: its clock, busy seconds, this process's CPU seconds, runnable."""

    def __init__(self) -> None:
        self.now, self.busy_s, self.own_s = 100.0, 50.0, 5.0
        self.running: int | None = 1
        self.mine: int | None = 1
        self.reads = 0
        self.stat = True

    def busy(self) -> float | None:
        self.reads += 1
        return self.busy_s if self.stat else None

    def watch(self) -> CoreWatch:
        return CoreWatch(
            clock=lambda: self.now,
            busy=self.busy,
            own=lambda: self.own_s,
            running=lambda: self.running,
            mine=lambda: self.mine,
            window=0.2,
            long=1.0,
        )

    def advance(self, wall: float, others: float, own: float = 0.0) -> None:
        """``wall`` seconds in which other processes use ``others`` cores, we ``own``."""
        self.now += wall
        self.busy_s += (others + own) * wall
        self.own_s += own * wall


def test_the_first_check_counts_runnable_tasks() -> None:
    m = Machine()
    m.running = 2  # the caller and one busy process
    assert not m.watch().team_fits(2, 2)
    m.running = 1
    assert m.watch().team_fits(2, 2)
    m.running, m.mine = 2, 2  # ours: the caller and our team's spinning thread
    assert m.watch().team_fits(2, 2)
    m.mine = None
    assert not m.watch().team_fits(2, 2)
    assert m.watch().team_fits(1, 2) and m.reads == 4  # a team of one asks nothing


def test_later_checks_judge_other_processes_cpu_time() -> None:
    m = Machine()
    w = m.watch()
    assert w.team_fits(2, 2)
    m.advance(0.25, others=0.1, own=1.9)  # our team's threads, busy or spinning: not counted
    assert w.team_fits(2, 2)
    m.advance(0.25, others=1.0, own=1.0)  # a busy process arrived
    assert not w.team_fits(2, 2)
    m.advance(0.25, others=0.25, own=1.0)
    assert w.team_fits(2, 2)


def test_a_check_within_the_window_repeats_the_verdict() -> None:
    m = Machine()
    w = m.watch()
    assert w.team_fits(2, 2)
    m.advance(0.25, others=1.0)
    assert not w.team_fits(2, 2)
    reads = m.reads
    m.advance(0.1, others=0.0)
    m.running = 1
    assert not w.team_fits(2, 2) and m.reads == reads  # nothing read
    m.advance(0.15, others=0.0)  # 0.25 s since the sample: judged again
    assert w.team_fits(2, 2) and m.reads == reads + 1


def test_after_a_long_gap_the_runnable_count_judges() -> None:
    m = Machine()
    w = m.watch()
    assert w.team_fits(2, 2)
    m.running = 2
    m.advance(1.5, others=0.0)  # the window says idle, but it is long: the count judges
    assert not w.team_fits(2, 2)
    m.running = 1
    m.advance(0.25, others=0.0)
    assert w.team_fits(2, 2)


def test_without_cpu_accounting_every_check_counts_runnable_tasks() -> None:
    m = Machine()
    m.stat = False
    w = m.watch()
    assert w.team_fits(2, 2)
    m.running = 2
    m.advance(0.25, others=1.0)
    assert not w.team_fits(2, 2)
    m.running = None  # nothing known at all: the measured choice runs
    m.advance(0.25, others=1.0)
    assert w.team_fits(2, 2)


def test_without_cpu_accounting_a_check_within_the_window_reads_nothing() -> None:
    m = Machine()
    m.stat = False
    counted: list[int] = []

    def mine() -> int:
        counted.append(1)
        return 1

    w = dataclasses.replace(m.watch(), mine=mine)
    assert w.team_fits(2, 2) and m.reads == 1 and counted == [1]
    m.advance(0.1, others=0.0)
    m.running = 2
    assert w.team_fits(2, 2) and m.reads == 1 and counted == [1]  # the verdict repeated
    m.running = None  # nothing known: this process's threads are not counted either
    m.advance(0.15, others=0.0)
    assert w.team_fits(2, 2) and m.reads == 2 and counted == [1]


def test_a_sample_that_goes_backwards_is_dropped() -> None:
    m = Machine()
    w = m.watch()
    assert w.team_fits(2, 2)
    m.advance(0.25, others=0.0)
    m.own_s = 0.0  # a forked child's CPU time
    m.running = 2
    assert w.team_fits(2, 2)  # no verdict from it: the last one stands
    m.advance(0.25, others=0.0)
    assert not w.team_fits(2, 2)  # no sample to compare with: the count judges
    m.advance(0.25, others=0.0)
    m.busy_s -= 10.0  # the machine's counter went backwards
    m.running = 1
    assert not w.team_fits(2, 2)
    m.advance(0.25, others=0.0)
    assert w.team_fits(2, 2)


# -------------------------------------------------------- Calibrator.skip
def _measured(cal: Calibrator, key: str, seconds: dict[str, float]) -> None:
    cal._choices[key] = CopyChoice(key, min(seconds, key=seconds.__getitem__), seconds, 1, "x", "")


def test_skip_picks_from_the_same_measurement_and_counts() -> None:
    cal = Calibrator(margin=0.25)
    _measured(cal, "k", {"1": 3.0, "2": 2.0, "0": 1.0})
    assert cal.skip("k", "0") == "2"  # "1" is not within 25% of "2"
    assert cal.skip("k", "0") == "2"
    _measured(cal, "j", {"1": 2.4, "2": 2.0, "0": 1.0})
    assert cal.skip("j", "0") == "1"  # within the margin: the earlier candidate
    assert cal.skip("k", "0", among=["1", "0"]) == "1"  # only what the call offers
    assert cal.skip("k", "0", among=["0"]) == "1"  # nothing offered: the default
    assert cal.skipped() == {"j": ("1", 1), "k": ("1", 4)}
    assert cal.current("k") == "0"  # the choice itself stays
    cal.forget()
    assert cal.skipped() == {}


def test_skip_ranks_as_choose_was_given_them() -> None:
    """The same ranks as the measurement's: ``stream2`` (rank 2, as fast as ``2``)
    beside ``1`` and ``stream1`` (rank 1) is preferred only beyond the rank margin (in
    order, the margin)."""
    cal = Calibrator(margin=0.25, rank_margin=0.25)
    _measured(cal, "k", {"1": 3.0, "2": 2.0, "0": 1.0, "stream1": 2.3, "stream2": 1.9})
    ranks = thread_ranks(["1", "2", "0", "stream1", "stream2"])
    assert cal.skip("k", "0", ranks=ranks) == "stream1"  # rank 1's fastest, within 25%
    assert cal.skip("k", "0") == "2"  # in order: 1 and 2 come first; 2 is within 25% of 1.9
    assert cal.skip("k", "0", among=["1", "2", "0", "stream2"], ranks=ranks) == "stream2"
    narrow = Calibrator(margin=0.25, rank_margin=0.1)  # stream1's 2.3 is not within 10%
    _measured(narrow, "k", {"1": 3.0, "2": 2.0, "0": 1.0, "stream1": 2.3, "stream2": 1.9})
    assert narrow.skip("k", "0", ranks=ranks) == "stream2"
    assert narrow.skip("k", "0") == "2"  # in order: the margin, 25%


def test_thread_ranks_are_thread_counts_with_the_team_last() -> None:
    names = ["1", "2", "0", "stream1", "stream2"]
    assert thread_ranks(names) == {"1": 1, "2": 2, "0": 3, "stream1": 1, "stream2": 2}
    assert thread_ranks(["1", "0"]) == {"1": 1, "0": 2}
    assert thread_ranks(["0"]) == {"0": 1}
    assert thread_ranks(["4", "stream8"]) == {"4": 4, "stream8": 8}
    assert thread_ranks([]) == {}


def test_skip_without_another_measured_candidate_runs_the_default() -> None:
    cal = Calibrator()
    assert cal.skip("unknown", "0") == "1"
    _measured(cal, "k", {"0": 1.0})
    assert cal.skip("k", "0", default="3") == "3"
    assert cal.skipped() == {"k": ("3", 1), "unknown": ("1", 1)}


# ------------------------------------------------ the AUTO copies, scripted
@pytest.fixture
def cal(monkeypatch: pytest.MonkeyPatch) -> Calibrator:
    fresh = Calibrator(budget_s=1e9)
    monkeypatch.setattr(_calibrate, "_default", fresh)
    return fresh


def _spy_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    ran: list[int] = []

    def spy(dst: list[torch.Tensor], src: list[torch.Tensor], *, threads: int = 0) -> None:
        ran.append(threads)
        copy_blocks(dst, src, threads=threads)

    monkeypatch.setattr(_auto_copy, "copy_blocks", spy)
    return ran


def _blocks() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    src = [torch.randint(0, 1 << 30, (4, 70000), generator=g, dtype=torch.int32) for _ in range(2)]
    return [torch.zeros_like(s) for s in src], src


@pytest.mark.parametrize("free", [True, False])
def test_a_team_choice_runs_only_with_free_cores(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator, free: bool
) -> None:
    dst, src = _blocks()
    key = f"copy cpu->cpu {_bucket(dst[0].numel() * 4)} contiguous"
    _measured(cal, key, {"1": 3.0, "2": 2.0, "0": 1.0})
    observed: list[str] = []
    real_observe = cal.observe

    def observe(key: str, nbytes: int, seconds: float, ran: str | None = None) -> bool:
        observed.append(key)
        return real_observe(key, nbytes, seconds, ran)

    monkeypatch.setattr(cal, "observe", observe)
    monkeypatch.setattr(_busy, "team_fits", lambda: free)
    ran = _spy_blocks(monkeypatch)
    copy_blocks(dst, src, threads=-1)
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
    assert ran == ([0] if free else [2])
    assert observed == ([key] if free else [])  # another candidate's time is not the choice's
    assert cal.skipped() == ({} if free else {key: ("2", 1)})


def test_a_skip_without_a_measured_alternative_takes_one_thread(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator
) -> None:
    dst, src = _blocks()
    key = f"copy cpu->cpu {_bucket(dst[0].numel() * 4)} contiguous"
    _measured(cal, key, {"0": 1.0})
    monkeypatch.setattr(_busy, "team_fits", lambda: False)
    ran = _spy_blocks(monkeypatch)
    copy_blocks(dst, src, threads=-1)
    assert ran == [1] and all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))


def test_a_non_team_choice_never_asks(monkeypatch: pytest.MonkeyPatch, cal: Calibrator) -> None:
    dst, src = _blocks()
    key = f"copy cpu->cpu {_bucket(dst[0].numel() * 4)} contiguous"
    _measured(cal, key, {"1": 1.0, "2": 2.0, "0": 3.0})

    def boom() -> bool:
        raise AssertionError("asked")

    monkeypatch.setattr(_busy, "team_fits", boom)
    ran = _spy_blocks(monkeypatch)
    copy_blocks(dst, src, threads=-1)
    assert ran == [1]


@pytest.mark.parametrize("free", [True, False])
def test_a_gather_calibrated_to_the_team_keeps_its_bytes(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator, free: bool
) -> None:
    g = torch.Generator().manual_seed(5)
    src = [torch.randint(0, 1 << 62, (900, 1, 144), generator=g) for _ in range(2)]
    s_idx, d_idx = torch.randperm(900, generator=g)[:800], torch.randperm(1000, generator=g)[:800]
    want = [torch.zeros(1000, 1, 144, dtype=torch.int64) for _ in src]
    for w, s in zip(want, src, strict=True):
        w.index_copy_(0, d_idx, s.index_select(0, s_idx))
    key = f"gather cpu->cpu {_bucket(144 * 8)} rows"
    _measured(cal, key, {"1": 3.0, "2": 2.0, "0": 1.0})
    monkeypatch.setattr(_busy, "team_fits", lambda: free)
    got = [torch.zeros(1000, 1, 144, dtype=torch.int64) for _ in src]
    gather_rows(got, src, d_idx, s_idx, threads=-1)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert cal.skipped() == ({} if free else {key: ("2", 1)})


# ------------------------------------------- _run: measuring and reporting
def test_a_block_copy_measures_atens_team_and_memmove_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = iter(range(10**6))
    cal = Calibrator(timer=lambda: float(next(ticks)), budget_s=1e9)
    monkeypatch.setattr(_calibrate, "_default", cal)
    dst, src = _blocks()
    copy_blocks(dst, src, threads=-1)
    d = torch.zeros(1 << 21, dtype=torch.uint8)
    s = torch.randint(0, 255, (1 << 21,), dtype=torch.uint8)
    half = 1 << 20
    memmove_blocks(
        [d.data_ptr(), d.data_ptr() + half],
        [s.data_ptr(), s.data_ptr() + half],
        [half, half],
        threads=-1,
    )
    assert torch.equal(d, s)
    by_op = {c.key.split()[0]: c for c in cal.choices()}
    assert "0" in by_op["copy"].seconds and "0" not in by_op["memmove"].seconds


def test_the_sample_is_the_mean_bytes_of_its_segments(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator
) -> None:
    src = [torch.randint(0, 1 << 30, (1 << 17,), dtype=torch.int32) for _ in range(10)]
    dst = [torch.zeros_like(s) for s in src]  # ten 512 KiB blocks: five 1 MiB segments
    copy_blocks(dst, src, threads=-1)
    (choice,) = cal.choices()
    assert type(choice.nbytes) is int and choice.nbytes == 1 << 20
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))


def test_a_known_choice_builds_no_sample(monkeypatch: pytest.MonkeyPatch, cal: Calibrator) -> None:
    dst, src = _blocks()
    key = f"copy cpu->cpu {_bucket(dst[0].numel() * 4)} contiguous"
    _measured(cal, key, {"1": 1.0, "2": 2.0, "0": 3.0})

    def boom(sizes: object) -> None:
        raise AssertionError("sampled")

    monkeypatch.setattr(_auto_copy, "_spans", boom)
    copy_blocks(dst, src, threads=-1)
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))


def test_a_real_copy_reports_its_own_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(1000, 10**6))
    cal = Calibrator(timer=lambda: float(next(ticks)), budget_s=1e9)
    monkeypatch.setattr(_calibrate, "_default", cal)
    dst, src = _blocks()
    key = f"copy cpu->cpu {_bucket(dst[0].numel() * 4)} contiguous"
    _measured(cal, key, {"1": 1.0, "2": 2.0})
    seen: list[tuple[str, int, float, str | None]] = []

    def observe(k: str, nbytes: int, seconds: float, ran: str | None = None) -> bool:
        seen.append((k, nbytes, seconds, ran))
        return False

    monkeypatch.setattr(cal, "observe", observe)
    copy_blocks(dst, src, threads=-1)
    assert seen == [(key, 2 * dst[0].numel() * 4, 1.0, "1")]  # one tick: start, then end


def test_the_window_and_the_long_gap_are_inclusive_bounds() -> None:
    m = Machine()
    w = dataclasses.replace(m.watch(), window=0.25, long=1.0)
    assert w.team_fits(2, 2)
    m.advance(0.25, others=1.0)  # exactly one window: judged again
    assert not w.team_fits(2, 2)
    m.running = 2  # the count would say busy; the window (exactly `long`) says idle
    m.advance(1.0, others=0.0)
    assert w.team_fits(2, 2)
