"""A copy shared out over the copy threads (``_copy._share``, ``stream_shared``): every
range once, the calling thread starting at once, a late copy thread taking fewer ranges or
none, errors stopping new ranges (docs/design.md, "The streaming copy")."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import numpy as np
import pytest

from sgl_core.transfer.copy import _copy, _stream, _stream_gather
from sgl_core.transfer.copy._stream_table import ops_table

needs_stream = pytest.mark.skipif(
    _stream.stream_copy() is None, reason=f"streaming copy: {_stream.stream_copy_status()}"
)


def _recorder() -> tuple[list[tuple[int, int, int]], Any]:
    """``part(a, b)`` that records (a, b, thread id)."""
    got: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def part(a: int, b: int) -> None:
        with lock:
            got.append((a, b, threading.get_ident()))

    return got, part


def test_every_range_is_taken_once_and_covers_the_count() -> None:
    got, part = _recorder()
    _copy._share(2, 100, part, 7)
    spans = sorted((a, b) for a, b, _ in got)
    assert len(spans) == 7
    assert spans[0][0] == 0 and spans[-1][1] == 100
    assert all(b == a2 for (_, b), (a2, _) in itertools.pairwise(spans))


@pytest.mark.parametrize(("threads", "count", "ranges"), [(1, 100, 8), (2, 1, 8), (2, 0, 8)])
def test_one_thread_or_one_item_is_one_call_on_the_calling_thread(
    threads: int, count: int, ranges: int
) -> None:
    got, part = _recorder()
    _copy._share(threads, count, part, ranges)
    assert got == [(0, count, threading.get_ident())]


def test_fewer_ranges_than_threads_still_cut_one_per_thread() -> None:
    """``ranges`` below the thread count (a small copy): one range per thread."""
    got, part = _recorder()
    _copy._share(2, 10, part, 0)
    assert sorted((a, b) for a, b, _ in got) == [(0, 5), (5, 10)]


def test_a_copy_thread_that_starts_late_takes_fewer_ranges() -> None:
    """The copy thread is held back until the caller took six ranges: the caller copies
    more than a fixed half, the copy thread the rest once let go, and none twice."""
    caller = threading.get_ident()
    release = threading.Event()
    got, record = _recorder()
    mine: list[int] = []

    def part(a: int, b: int) -> None:
        if threading.get_ident() != caller:
            release.wait(5)
        else:
            mine.append(a)
            if len(mine) == 6:
                release.set()
                time.sleep(0.2)  # the copy thread takes what is left meanwhile
        record(a, b)

    _copy._share(2, 100, part, 10)
    assert sorted(a for a, _, _ in got) == list(range(0, 100, 10))
    assert 6 <= len(mine) < 10


def test_a_copy_thread_that_never_started_is_not_waited_for() -> None:
    """Every range taken before a copy thread starts (each is busy with another task): the
    call returns without waiting for them, and their tasks, when they run, take nothing."""
    caller = threading.get_ident()
    gate = threading.Event()
    pool = _copy._pool()
    blockers = [pool.submit(gate.wait, 5) for _ in range(_copy._workers)]
    try:
        got, part = _recorder()
        start = time.perf_counter()
        _copy._share(_copy._workers + 1, 40, part, 4)
        assert time.perf_counter() - start < 2
        assert [t for _, _, t in got] == [caller] * 4
    finally:
        gate.set()
        for blocker in blockers:
            blocker.result()
    pool.submit(lambda: None).result()  # the queue has drained: nothing else ran a range
    assert len(got) == 4


def test_an_error_stops_new_ranges_and_is_raised_after_started_ones_end() -> None:
    caller = threading.get_ident()
    got, record = _recorder()
    started, ended = threading.Event(), threading.Event()

    def part(a: int, b: int) -> None:
        if threading.get_ident() != caller:
            started.set()
            time.sleep(0.05)
            record(a, b)
            ended.set()
            return
        if a >= 20:
            started.wait(5)
            raise OSError("copy failed")
        record(a, b)

    with pytest.raises(OSError, match="copy failed"):
        _copy._share(2, 100, part, 10)
    assert ended.is_set()  # the copy thread's range ended before the error came out
    assert len(got) <= 3  # no range was taken after the error


@needs_stream
def test_stream_shared_cuts_ranges_of_about_share_bytes() -> None:
    """A table of 40 pieces of 1 MiB: 10 ranges of about 4 MiB (the streaming copy's own
    calls), bit-exact."""
    src = np.random.default_rng(1).integers(0, 255, 40 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    mib = 1 << 20
    ops = ops_table(
        [dst.ctypes.data + i * mib for i in range(40)],
        [src.ctypes.data + i * mib for i in range(40)],
        [mib] * 40,
    )
    calls: list[int] = []
    real = _stream.stream_each

    def counted(table: Any) -> None:
        calls.append(int(table.shape[0]))
        real(table)

    _stream_gather.stream_shared(ops, 2, counted)
    assert sorted(calls) == [4] * 10
    assert np.array_equal(dst, src)
    calls.clear()
    _stream_gather.stream_shared(ops[:2], 2, counted)
    assert sorted(calls) == [1, 1]  # under SHARE_BYTES: one range per thread


@pytest.mark.parametrize("threads", [2, 3])
def test_one_task_per_copy_thread_asked_for(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """``threads`` threads in all: the caller and ``threads - 1`` tasks on the pool."""
    submitted: list[object] = []
    pool = _copy._pool()

    class Counting:
        def submit(self, fn: Any, *args: Any) -> Any:
            submitted.append(fn)
            return pool.submit(fn, *args)

    monkeypatch.setattr(_copy, "_pool", Counting)
    got, part = _recorder()
    _copy._share(threads, 100, part, 10)
    assert len(submitted) == threads - 1
    assert sorted(a for a, _, _ in got) == list(range(0, 100, 10))
