"""Row gathers (``gather_rows`` under ``AUTO``: page-1 backups, Ascend transfers) by the
streaming copy: bit-exact, offered only where it may copy the rows, chosen by the
calibrator like the thread counts (a fake clock; no timed assertions)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sgl_core.backend import copy_calibration
from sgl_core.transfer.copy import _busy, _calibrate, _stream
from sgl_core.transfer.copy._auto_copy import _bucket, thread_candidates, thread_ranks
from sgl_core.transfer.copy._calibrate import Calibrator, CopyChoice
from sgl_core.transfer.copy._engine import gather_rows
from sgl_core.transfer.copy._stream_gather import gather_streams

needs_stream = pytest.mark.skipif(
    _stream.stream_copy() is None, reason=f"streaming copy: {_stream.stream_copy_status()}"
)
ALL = ["1", "2", "0", "stream1", "stream2"]


def _case(
    dtype: torch.dtype = torch.int16, width: int = 576, pairs: int = 3
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    src = [
        torch.randint(-(1 << 15), 1 << 15, (700, 1, width), generator=g, dtype=torch.int16)
        .view(torch.uint8)
        .view(dtype)
        for _ in range(pairs)
    ]
    dst = [torch.empty((900, *s.shape[1:]), dtype=dtype) for s in src]
    for d in dst:
        d.view(torch.uint8).fill_(3)
    s_idx = torch.randint(0, 700, (800,), generator=g)  # sources may repeat
    d_idx = torch.randperm(900, generator=g)[:800]
    return dst, src, d_idx, s_idx


def _want(
    dst: list[torch.Tensor], src: list[torch.Tensor], d: torch.Tensor, s: torch.Tensor
) -> list[torch.Tensor]:
    want = [t.view(torch.uint8).clone() for t in dst]
    for w, x in zip(want, src, strict=True):
        w.index_copy_(0, d, x.view(torch.uint8).index_select(0, s))
    return want


@pytest.fixture
def cal(monkeypatch: pytest.MonkeyPatch) -> Calibrator:
    ticks = iter(range(10**6))
    fresh = Calibrator(timer=lambda: float(next(ticks)), budget_s=1e9)
    monkeypatch.setattr(_calibrate, "_default", fresh)
    return fresh


def _seed(cal: Calibrator, key: str, choice: str, seconds: dict[str, float]) -> None:
    cal._choices[key] = CopyChoice(key, choice, seconds, 1, "measured", "")


def _count_streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = _stream.stream_each

    def spy(ops: Any) -> None:
        calls.append(int(ops.shape[0]))
        real(ops)

    monkeypatch.setattr(_stream, "stream_each", spy)
    return calls


@needs_stream
@pytest.mark.parametrize("choice", ["stream1", "stream2"])
@pytest.mark.parametrize("dtype", [torch.int16, torch.float8_e4m3fn])
def test_a_chosen_streaming_gather_is_bit_exact(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator, choice: str, dtype: torch.dtype
) -> None:
    dst, src, d_idx, s_idx = _case(dtype)
    want = _want(dst, src, d_idx, s_idx)
    _seed(cal, f"gather cpu->cpu {_bucket(1152)} rows", choice, dict.fromkeys(ALL, 1.0))
    calls = _count_streams(monkeypatch)
    gather_rows(dst, src, d_idx, s_idx, threads=-1)
    assert sum(calls) == 3 * 800 and len(calls) == int(choice[-1])  # every row, once
    assert all(torch.equal(d.view(torch.uint8), w) for d, w in zip(dst, want, strict=True))


@needs_stream
def test_a_gather_measures_the_streaming_candidates_after_the_thread_counts(
    cal: Calibrator,
) -> None:
    dst, src, d_idx, s_idx = _case()
    want = _want(dst, src, d_idx, s_idx)
    gather_rows(dst, src, d_idx, s_idx, threads=-1)
    (choice,) = copy_calibration()
    assert list(choice.seconds)[-2:] == ["stream1", "stream2"] and choice.choice == "1"
    assert all(torch.equal(d.view(torch.uint8), w) for d, w in zip(dst, want, strict=True))


@needs_stream
def test_gathers_the_streaming_copy_may_not_do_are_not_offered() -> None:
    dst, src, d_idx, s_idx = _case()
    assert gather_streams(dst, src, d_idx, s_idx) is not None
    twice = d_idx.clone()
    twice[5] = twice[6]
    assert gather_streams(dst, src, twice, s_idx) is None  # a destination row twice
    assert gather_streams(dst, src, twice[5:7], s_idx[:2]) is None  # two rows, the same
    assert gather_streams(dst, src, twice[4:6], s_idx[:2]) is not None
    for bad in (-1, 700):
        out = s_idx.clone()
        out[3] = bad
        assert gather_streams(dst, src, d_idx, out) is None  # a source row out of range
    far = d_idx.clone()
    far[0] = 900
    assert gather_streams(dst, src, far, s_idx) is None
    assert gather_streams(dst, src, d_idx[:5], s_idx[:6]) is None  # indices do not pair
    assert gather_streams(dst, src, d_idx[:4, None], s_idx[:4, None]) is None
    small = _case(width=16)  # 32-byte rows: under the streaming stores' 64
    assert gather_streams(*small) is None
    shared = torch.zeros(1000, 1, 576, dtype=torch.int16)  # the two sides overlap
    assert gather_streams([shared[100:]], [shared[:700]], d_idx, s_idx) is None
    assert gather_streams(dst, src, d_idx[:0], s_idx[:0]) is not None  # nothing to copy


@needs_stream
def test_without_the_streaming_copy_a_cached_streaming_choice_is_measured_again(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator
) -> None:
    dst, src, d_idx, s_idx = _case()
    want = _want(dst, src, d_idx, s_idx)
    key = f"gather cpu->cpu {_bucket(1152)} rows"
    _seed(cal, key, "stream2", dict.fromkeys(ALL, 1.0))  # as if from the disk cache
    monkeypatch.setenv(_stream.ENV_VAR, "0")
    monkeypatch.setattr(_stream, "_loaded", None)
    gather_rows(dst, src, d_idx, s_idx, threads=-1)
    (choice,) = copy_calibration()
    assert choice.choice == "1" and "stream1" not in choice.seconds
    assert all(torch.equal(d.view(torch.uint8), w) for d, w in zip(dst, want, strict=True))


@needs_stream
@pytest.mark.parametrize("offered", [True, False])
def test_a_skipped_team_may_run_the_streaming_copy(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator, offered: bool
) -> None:
    """The team has no free core: the runner-up of the measurement runs, the streaming
    copy too; where this call does not offer it, the runner-up among what it offers."""
    dst, src, d_idx, s_idx = _case()
    want = _want(dst, src, d_idx, s_idx)
    key = f"gather cpu->cpu {_bucket(1152)} rows"
    seconds = {"1": 3.0, "2": 2.0, "0": 1.0, "stream1": 1.5, "stream2": 2.5}
    _seed(cal, key, "0", seconds)
    monkeypatch.setattr(_busy, "team_fits", lambda: False)
    if not offered:
        monkeypatch.setenv(_stream.ENV_VAR, "0")
        monkeypatch.setattr(_stream, "_loaded", None)
        seconds_left = {k: v for k, v in seconds.items() if not k.startswith("stream")}
        _seed(cal, key, "0", seconds_left | {"stream1": 1.5})
    calls = _count_streams(monkeypatch)
    gather_rows(dst, src, d_idx, s_idx, threads=-1)
    assert (sum(calls) == 3 * 800) is offered
    assert cal.skipped() == {key: ("stream1" if offered else "2", 1)}
    assert all(torch.equal(d.view(torch.uint8), w) for d, w in zip(dst, want, strict=True))


@needs_stream
def test_a_gather_ranks_its_candidates_by_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measurement and a skipped team's runner-up rank the candidates by thread count
    (``thread_ranks``): ``stream2`` as fast as ``2`` and within the margin of nothing on
    one thread runs, where in plain order ``2`` (earlier, within 25%) would."""
    asked: list[Any] = []

    class Spy(Calibrator):
        def choose(self, *args: Any, **kw: Any) -> str:
            asked.append(kw.get("ranks"))
            return super().choose(*args, **kw)

    cal = Spy(budget_s=1e9, confirm_calls=0)  # the sample decides (then seeded below)
    monkeypatch.setattr(_calibrate, "_default", cal)
    dst, src, d_idx, s_idx = _case()
    want = _want(dst, src, d_idx, s_idx)
    # the measured call runs its choice whatever the machine's load (a real sample may
    # choose the team, and a busy moment, e.g. another test worker, would skip it)
    monkeypatch.setattr(_busy, "team_fits", lambda: True)
    gather_rows(dst, src, d_idx, s_idx, threads=-1)
    assert asked == [thread_ranks(ALL)] and cal.skipped() == {}
    key = f"gather cpu->cpu {_bucket(1152)} rows"
    _seed(cal, key, "0", {"1": 3.0, "2": 2.0, "0": 1.0, "stream1": 2.4, "stream2": 1.9})
    monkeypatch.setattr(_busy, "team_fits", lambda: False)
    calls = _count_streams(monkeypatch)
    gather_rows(dst, src, d_idx, s_idx, threads=-1)
    assert cal.skipped() == {key: ("stream2", 1)} and len(calls) == 2
    assert all(torch.equal(d.view(torch.uint8), w) for d, w in zip(dst, want, strict=True))


@needs_stream
def test_thread_count_candidates_never_run_the_streaming_copy(
    monkeypatch: pytest.MonkeyPatch, cal: Calibrator
) -> None:
    """Measuring (3 timed rounds and a warm-up, every candidate): only ``stream1`` (one
    table a run) and ``stream<n>`` (n parts a run) call the streaming copy; the chosen
    ``1`` then runs without it."""
    dst, src, d_idx, s_idx = _case()
    want = _want(dst, src, d_idx, s_idx)
    calls = _count_streams(monkeypatch)
    gather_rows(dst, src, d_idx, s_idx, threads=-1)
    assert copy_calibration()[0].choice == "1"
    # each streaming candidate ran 4 times, as one table part per thread
    assert len(calls) == 4 * sum(thread_candidates(with_aten=False))
    assert all(torch.equal(d.view(torch.uint8), w) for d, w in zip(dst, want, strict=True))


@needs_stream
def test_gather_lists_of_different_lengths_are_refused() -> None:
    dst, src, d_idx, s_idx = _case()
    with pytest.raises(ValueError):
        gather_streams(dst, src[:2], d_idx, s_idx)
