"""The streaming team (``_stream_team``, ``_team_code``): its code is what its source
assembles to; a call copies bit-exact on any thread count; every part is taken once, by
a thread with a seat in the call; the lead never waits for an absent helper; a busy team
or none falls back to the pool; bad bounds are refused before any byte moves; an
interrupted lead waits out the parts taken; helpers stop, and a forked child starts its
own."""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_copy_threads import forked_result
from test_stream_kernels import assembled

from sgl_core.transfer.copy import _copy, _stream, _stream_team, _team_code
from sgl_core.transfer.copy._stream_team import Team, team_bounds, team_each
from sgl_core.transfer.copy._team_code import BOX_WORDS, TEAM

X86_LINUX = sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(
    not X86_LINUX or _stream.stream_copy() is None, reason="the streaming copy is not loaded"
)
GatherFn = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_uint64)


def _table(n: int, size: int = 4096, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """(ops, dst, src, expected dst): ``n`` blocks of ``size`` bytes in a shuffled order.
    The caller keeps ``src`` (and ``dst``) alive while ``ops`` is used: it holds their
    addresses only."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, n * size + 64, dtype=np.uint8)
    dst = rng.integers(0, 256, n * size + 64, dtype=np.uint8)
    perm = rng.permutation(n)
    d, s = dst.ctypes.data, src.ctypes.data
    rows = [(d + i * size, s + p * size, size) for i, p in enumerate(perm)]
    ops = np.array(rows, dtype=np.uint64).reshape(-1, 3)
    want = dst.copy()
    want[: n * size] = src[: n * size].reshape(n, size)[perm].ravel() if n else want[:0]
    return ops, dst, src, want


class Recorder:
    """A Python gather for a team of its own: records (thread, first entry, count) per part."""

    def __init__(self, ops: Any, delay: Callable[[int], float] = lambda seat: 0.0) -> None:
        self.ops, self.delay = ops, delay
        self.calls: list[tuple[int, int, int]] = []
        self.fn = GatherFn(self._gather)
        self.address = ctypes.cast(self.fn, ctypes.c_void_p).value or 0

    def _gather(self, at: int, n: int) -> None:
        first = (at - self.ops.ctypes.data) // 24
        self.calls.append((threading.get_ident(), first, n))
        time.sleep(self.delay(threading.get_ident()))


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The busy-core check says yes (another xdist worker may be busy on the VM)."""
    monkeypatch.setattr(_stream_team, "_quiet", lambda threads: True)


@pytest.fixture
def own_team() -> Iterator[Callable[[Recorder], Team]]:
    """Teams on a page of their own (the process's team is left alone), stopped after."""
    made: list[Team] = []

    def make(rec: Recorder) -> Team:
        page = _stream.map_page(ctypes.CDLL(None, use_errno=True), TEAM.code)
        assert isinstance(page, int)
        made.append(Team(page, rec.address))
        return made[-1]

    yield make
    for team in made:
        team.stop()


@pytest.mark.skipif(shutil.which("as") is None or shutil.which("objcopy") is None, reason="no as")
def test_the_team_code_is_what_its_source_assembles_to(tmp_path: Path) -> None:
    code, obj = assembled(tmp_path, TEAM.asm)
    assert code == TEAM.code
    names = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True).stdout
    at = {line.split()[2]: int(line.split()[0], 16) for line in names.splitlines()}
    assert (at["lead"], at["wait"], at["serve"]) == (TEAM.lead, TEAM.wait, TEAM.serve)
    assert BOX_WORDS == 7 and len(TEAM.code) <= 4096


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 333])
@pytest.mark.parametrize("machine", ["quiet", "busy"])
def test_a_call_is_bit_exact_on_any_thread_count(
    monkeypatch: pytest.MonkeyPatch, machine: str, threads: int, n: int
) -> None:
    monkeypatch.setattr(_stream_team, "_quiet", lambda threads: machine == "quiet")
    ops, dst, _src, want = _table(n)
    for _ in range(3):  # again: a new generation each time, helpers awake or asleep
        team_each(ops, team_bounds(n, threads), threads)
        assert np.array_equal(dst, want)
        dst[: n * 4096] = 0
    team_each(ops, team_bounds(n, threads), threads)
    assert np.array_equal(dst, want)
    if n >= 2:  # bounds with empty parts are bounds too
        dst[: n * 4096] = 0
        team_each(ops, np.array([0, 0, n // 2, n // 2, n, n], dtype=np.uint64), threads)
        assert np.array_equal(dst, want)


@pytest.mark.parametrize(
    ("entries", "threads"), [(0, 2), (1, 2), (3, 2), (10, 1), (10, 2), (10, 3)]
)
def test_bounds_cut_a_table_into_parts_per_thread(entries: int, threads: int) -> None:
    b = team_bounds(entries, threads)
    assert b.dtype == np.uint64 and b[0] == 0 and b[-1] == entries
    assert b.shape[0] - 1 == min(_stream_team.PARTS_PER_THREAD * threads, entries)
    assert (np.diff(b.astype(np.int64)) > 0).all()  # no empty part


@pytest.mark.parametrize(
    ("bounds", "match"),
    [
        (np.array([0, 3, 6], dtype=np.int64), "contiguous uint64"),
        (np.array([[0, 6]], dtype=np.uint64), "contiguous uint64"),
        (np.array([0, 9, 3, 9, 6], dtype=np.uint64)[::2], "contiguous uint64"),
        (np.array([], dtype=np.uint64), "from 0"),
        (np.array([0], dtype=np.uint64), "from 0"),
        (np.array([1, 6], dtype=np.uint64), "from 0"),
        (np.array([0, 5], dtype=np.uint64), "from 0"),
        (np.array([0, 7], dtype=np.uint64), "from 0"),
        (np.array([0, 4, 2, 6], dtype=np.uint64), "not decrease"),
    ],
)
def test_bad_bounds_are_refused_before_any_byte_moves(bounds: Any, match: str) -> None:
    ops, dst, _src, _ = _table(6)
    before = dst.copy()
    with pytest.raises(ValueError, match=match):
        team_each(ops, bounds, 2)
    assert np.array_equal(dst, before)


def test_a_bad_table_is_refused_before_any_byte_moves() -> None:
    ops, dst, _src, _ = _table(6)
    before = dst.copy()
    with pytest.raises(ValueError, match="C-ordered"):
        team_each(ops.astype(np.int64), team_bounds(6, 2), 2)
    with pytest.raises(ValueError, match="C-ordered"):
        team_each(np.asfortranarray(ops), team_bounds(6, 2), 2)
    assert np.array_equal(dst, before)


def test_every_part_is_taken_once_and_only_by_seated_threads(
    own_team: Callable[[Recorder], Team],
) -> None:
    ops, *_kept = _table(64)
    rec = Recorder(ops)
    team = own_team(rec)
    lead = threading.get_ident()
    assert team.run(ops, team_bounds(64, 2), 2) and len(team.helpers) == 1
    assert team.helpers[0].thread.name == "sgl-stream-1" and team.helpers[0].thread.daemon
    assert team.run(ops, team_bounds(64, 4), 4) and len(team.helpers) == 3
    assert team.run(ops, team_bounds(64, 2), 2) and len(team.helpers) == 3  # kept
    for call in range(40):
        rec.calls.clear()
        threads = 2 if call % 2 else 3
        bounds = team_bounds(64, threads)
        assert team.run(ops, bounds, threads)
        parts = sorted((first, n) for _, first, n in rec.calls)
        want = [(int(a), int(b - a)) for a, b in itertools.pairwise(bounds)]
        assert parts == want
        seated = {lead} | {h.thread.ident for h in team.helpers[: threads - 1]}
        assert {who for who, _, _ in rec.calls} <= seated
        assert team.box[1] == len(want)  # done counts every part


def test_the_lead_takes_every_part_a_helper_does_not(
    own_team: Callable[[Recorder], Team],
) -> None:
    ops, *_kept = _table(16)
    rec = Recorder(ops)
    team = own_team(rec)
    # no helper thread: the box says three threads, and only the lead takes parts
    bounds = team_bounds(16, 3)  # kept: the code reads it by address
    busy = team.lead(team.addr, ops.ctypes.data, bounds.ctypes.data, 6, 3, 10)
    assert busy == 0 and team.box[1] == 6
    assert {who for who, _, _ in rec.calls} == {threading.get_ident()}
    assert sorted(first for _, first, _ in rec.calls) == [0, 2, 5, 8, 10, 13]


def test_a_helper_asleep_is_woken_by_the_next_call(
    own_team: Callable[[Recorder], Team], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next call rings a sleeping helper's bell, and the helper takes parts of it. A
    helper the scheduler runs late may find them all taken (beside a busy machine): the
    property is asked of a few calls, each made while the helper sleeps."""
    shipped = _stream_team.SERVE_PAUSES
    ops, *_kept = _table(8)
    lead = threading.get_ident()
    rec = Recorder(ops, delay=lambda who: 0.05 if who == lead else 0.0)
    team = own_team(rec)
    joined = False
    for _ in range(5):
        monkeypatch.setattr(_stream_team, "SERVE_PAUSES", 50)  # it sleeps at once
        assert team.run(ops, team_bounds(8, 2), 2)
        helper = team.helpers[0]
        deadline = time.monotonic() + 10
        while not helper.asleep and time.monotonic() < deadline:
            time.sleep(0.001)
        assert helper.asleep
        # woken, it spins as shipped: a bell rung before the call is posted must not find
        # the helper asleep again by the time it is (50 pauses end in a microsecond)
        monkeypatch.setattr(_stream_team, "SERVE_PAUSES", shipped)
        rec.calls.clear()
        assert team.run(ops, team_bounds(8, 2), 2)  # the lead's parts are slow
        if helper.thread.ident in {who for who, _, _ in rec.calls}:
            joined = True
            break
    assert joined


@pytest.mark.usefixtures("quiet")
def test_a_busy_team_falls_back_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    ops, dst, _src, want = _table(40)
    team = _stream_team.stream_team()
    assert team is not None
    shared: list[int] = []
    real = _stream_team._stream_gather.stream_shared

    def spy(table: Any, threads: int, copy: Any) -> None:
        shared.append(threads)
        real(table, threads, copy)

    monkeypatch.setattr(_stream_team._stream_gather, "stream_shared", spy)
    before = _stream_team.team_calls()
    with team.lock:  # another thread leads
        team_each(ops, team_bounds(40, 2), 2)
    assert shared == [2] and np.array_equal(dst, want)
    assert _stream_team.team_calls()["led"] == before["led"] + 1
    dst[:-64] = 0  # the 64 bytes past the blocks are never written
    team_each(ops, team_bounds(40, 2), 2)  # free again: the team copies
    assert shared == [2] and np.array_equal(dst, want)


def test_one_thread_or_no_team_needs_no_team(monkeypatch: pytest.MonkeyPatch) -> None:
    ops, dst, _src, want = _table(40)
    monkeypatch.setattr(_stream_team, "_team", None)
    monkeypatch.setattr(_stream_team._stream, "map_page", lambda libc, code: pytest.fail("mapped"))
    team_each(ops, team_bounds(40, 1), 1)
    assert np.array_equal(dst, want) and _stream_team._team is None
    refused: list[str] = []
    monkeypatch.setattr(
        _stream_team._stream, "map_page", lambda libc, code: refused.append("x") or "refused"
    )
    shared: list[int] = []
    real = _stream_team._stream_gather.stream_shared
    monkeypatch.setattr(
        _stream_team._stream_gather,
        "stream_shared",
        lambda table, threads, copy: shared.append(threads) or real(table, threads, copy),
    )
    dst[:-64] = 0  # the 64 bytes past the blocks are never written
    before = _stream_team.team_calls()
    team_each(ops, team_bounds(40, 2), 2)
    team_each(ops, team_bounds(40, 2), 2)
    assert np.array_equal(dst, want) and shared == [2, 2]
    assert _stream_team.team_calls()["none"] == before["none"] + 2
    assert refused == ["x"] and _stream_team._team == "refused"  # asked once per process


def test_an_interrupted_lead_waits_out_the_parts_taken(
    own_team: Callable[[Recorder], Team], monkeypatch: pytest.MonkeyPatch
) -> None:
    ops, *_kept = _table(8)
    lead = threading.get_ident()
    rec = Recorder(ops, delay=lambda who: 0.0 if who == lead else 0.2)
    team = own_team(rec)
    assert team.run(ops, team_bounds(8, 2), 2)  # the helper exists and spins
    monkeypatch.setattr(_stream_team, "WAIT_PAUSES", 10)

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_stream_team, "time", types.SimpleNamespace(sleep=interrupted))
    rec.calls.clear()
    with pytest.raises(KeyboardInterrupt):
        for _ in range(50):  # until a call finds the helper's part unfinished
            team.run(ops, team_bounds(8, 2), 2)
    assert team.box[1] == 4  # every part was done before the lead let go
    assert not team.lock.locked()
    helper = team.helpers[0].thread.ident
    assert any(who == helper for who, _, _ in rec.calls)  # it took the part waited for


@pytest.mark.usefixtures("quiet")
def test_two_threads_calling_at_once_both_copy_bit_exact() -> None:
    cases = [_table(200, seed=s) for s in (1, 2)]
    errors: list[BaseException] = []

    def calls(ops: Any, dst: Any, want: Any) -> None:
        try:
            for _ in range(30):
                dst[:-64] = 0  # the 64 bytes past the blocks are never written
                team_each(ops, team_bounds(200, 2), 2)
                assert np.array_equal(dst, want)
        except BaseException as e:  # reported below
            errors.append(e)

    workers = [threading.Thread(target=calls, args=(o, d, w)) for o, d, _src, w in cases]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors


@pytest.mark.usefixtures("quiet")
def test_shutdown_stops_the_helpers_and_a_new_team_starts() -> None:
    ops, dst, _src, want = _table(40)
    team_each(ops, team_bounds(40, 2), 2)
    team = _stream_team.stream_team()
    assert team is not None and team.helpers
    threads = [h.thread for h in team.helpers]
    _copy.shutdown_copy_threads()
    assert team.stopped and not any(t.is_alive() for t in threads)
    assert _stream_team._team is None
    dst[:-64] = 0  # the 64 bytes past the blocks are never written
    team_each(ops, team_bounds(40, 2), 2)
    again = _stream_team.stream_team()
    assert again is not None and again is not team and np.array_equal(dst, want)


def test_shutdown_calls_every_stop_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_copy, "_shutdown_hooks", list(_copy._shutdown_hooks))
    stopped: list[str] = []
    _copy.at_shutdown(lambda: stopped.append("a"))
    _copy.at_shutdown(lambda: stopped.append("b"))
    _copy.shutdown_copy_threads()
    assert stopped == ["a", "b"]
    assert _stream_team._stop_team in _copy._shutdown_hooks  # registered at import


def _child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    ops, dst, _src, want = _table(40)
    team_each(ops, team_bounds(40, 2), 2)
    team = _stream_team.stream_team()
    queue.put(np.array_equal(dst, want) and team is not None and team is not _parent[0])


_parent: list[Team | None] = [None]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_a_team_of_its_own() -> None:
    ops, *_kept = _table(40)
    team_each(ops, team_bounds(40, 2), 2)
    _parent[0] = _stream_team.stream_team()
    assert forked_result(_child) is True


def test_a_busy_machine_copies_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spinning pays only with a core per thread: where the busy-core check says no, the
    call copies on its own thread (neither team nor pool), and each thread count has its
    own watch."""
    asked: list[tuple[int, Any]] = []

    def fits(threads: int, watch: Any) -> bool:
        asked.append((threads, watch))
        return threads != 2

    monkeypatch.setattr(_stream_team._busy, "team_fits", fits)
    monkeypatch.setattr(_stream_team, "_watches", {})
    shared: list[int] = []
    real = _stream_team._stream_gather.stream_shared
    monkeypatch.setattr(
        _stream_team._stream_gather,
        "stream_shared",
        lambda table, threads, copy: shared.append(threads) or real(table, threads, copy),
    )
    team = _stream_team.stream_team()
    assert team is not None
    led = [0]
    real_run = team.run

    def run(*args: Any) -> bool:
        led[0] += 1
        return real_run(*args)

    monkeypatch.setattr(team, "run", run)
    ops, dst, _src, want = _table(40)
    before = _stream_team.team_calls()
    team_each(ops, team_bounds(40, 2), 2)
    assert shared == [] and led == [0] and np.array_equal(dst, want)
    dst[:-64] = 0
    team_each(ops, team_bounds(40, 3), 3)  # fits: the team copies
    assert shared == [] and led == [1] and np.array_equal(dst, want)
    team_each(ops, team_bounds(40, 2), 2)
    assert [t for t, _ in asked] == [2, 3, 2]
    after = _stream_team.team_calls()
    assert (after["busy"] - before["busy"], after["team"] - before["team"]) == (2, 1)
    watches = _stream_team._watches
    assert asked[0][1] is watches[2] and asked[1][1] is watches[3] and asked[2][1] is watches[2]
    assert watches[2] is not watches[3]


def test_the_team_judges_busy_cores_by_a_window_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a sample the check says yes (an instant's runnable count is not asked);
    over a window where other processes took the cores, no, however long the window."""
    monkeypatch.setattr(_stream_team, "_watches", {})
    monkeypatch.setattr(_stream_team._busy, "affinity", lambda: frozenset({0, 1}))
    assert _stream_team._quiet(2)
    watch = _stream_team._watches[2]
    assert watch.running() is None
    now, busy = [100.0], [50.0]
    watch.clock, watch.busy, watch.own = (lambda: now[0]), (lambda: busy[0]), (lambda: 1.0)
    watch._at = watch._last = None  # judge again: the first sample, no window yet
    assert _stream_team._quiet(2)
    now[0], busy[0] = 100.5, 50.9  # others used 1.8 cores over the window
    assert not _stream_team._quiet(2)
    now[0], busy[0] = 101.0, 50.95  # then 0.1
    assert _stream_team._quiet(2)
    now[0], busy[0] = 131.0, 80.0  # a pause is a window too: 0.97 cores over 30 s
    assert not _stream_team._quiet(2)
    assert watch.long == float("inf")


def test_no_team_without_the_streaming_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stream_team, "_team", None)
    monkeypatch.setattr(_stream, "_loaded", (None, "off (SGLCORE_STREAM_COPY=0)"))
    assert _stream_team.stream_team() is None and _stream_team._team is None


def test_the_box_words_are_where_the_code_reads_them() -> None:
    assert (_stream_team._WORK, _stream_team._GATHER) == (0, 6)
    assert _team_code.BOX_WORDS == 7
