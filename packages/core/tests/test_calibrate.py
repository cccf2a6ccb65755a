"""Copy calibration (issue #27): decisions on a fake clock, re-measurement, the disk cache.

No timed assertions: every duration here is scripted on a fake clock; the
real copies the calibrator times in the pool tests are checked for their
bytes and for which choice was recorded, never for their speed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import sgl_core
from sgl_core.backend import CopyTuning
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_core.transfer.copy import _busy, _calibrate, _calibration_cache
from sgl_core.transfer.copy._calibrate import (
    ENV_VAR,
    FORMAT,
    Calibrator,
    CopyChoice,
    DiskCache,
    copy_calibration,
    host_id,
)
from sgl_core.transfer.copy._stream import stream_copy_status


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def cost(self, seconds: float | list[float]) -> Callable[[], None]:
        """A candidate that takes ``seconds`` (or the next of a list) on this clock."""
        times = iter(seconds if isinstance(seconds, list) else [])
        fixed = seconds if isinstance(seconds, float) else None

        def run() -> None:
            self.now += fixed if fixed is not None else next(times)

        return run


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_the_fastest_candidate_wins_and_the_choice_is_explained(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, budget_s=10)
    cands = {"1": clock.cost(0.5), "2": clock.cost(0.125), "0": clock.cost(0.25)}
    assert cal.choose("copy k", cands, nbytes=125_000_000) == "2"
    (choice,) = cal.choices()
    assert choice.key == "copy k" and choice.source == "measured"
    assert choice.seconds == {"1": 0.5, "2": 0.125, "0": 0.25}
    assert choice.gbps == pytest.approx(1.0)
    why = "2 (fastest; slowest rounds 1: 500.000 ms, 2: 125.000 ms, 0: 250.000 ms)"
    assert choice.reason == why  # the whole reason: nothing appended to a first measurement


def test_the_slowest_round_counts_and_the_warm_up_round_does_not(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, rounds=3, budget_s=100)
    # "a" is fast but waits once (a team stalling on a busy core): charged its 4 s round;
    # "b" is steady at 1.5 s. Warm-ups (9 s, 0.1 s) do not count.
    cands = {"a": clock.cost([9.0, 0.5, 4.0, 0.5]), "b": clock.cost([0.1, 1.5, 1.5, 1.5])}
    assert cal.choose("k", cands, nbytes=10) == "b"
    assert cal.choices()[0].seconds == pytest.approx({"a": 4.0, "b": 1.5})
    steady = {"a": clock.cost([9.0, 0.5, 0.75, 0.5]), "b": clock.cost([0.1, 1.5, 1.5, 1.5])}
    assert cal.choose("j", steady, nbytes=10) == "a"


def test_an_earlier_candidate_within_the_margin_is_preferred(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, margin=0.1, budget_s=10)
    assert cal.choose("k", {"1": clock.cost(1.05), "2": clock.cost(1.0)}, nbytes=1) == "1"
    assert "preferred within 10% of 2" in cal.choices()[0].reason
    assert cal.choose("j", {"1": clock.cost(1.2), "2": clock.cost(1.0)}, nbytes=1) == "2"


def test_ranks_ask_the_margin_of_later_ranks_only(clock: FakeClock) -> None:
    """Candidates of one rank compete on speed alone (a tie: the earlier); a later rank's
    fastest must beat the earlier ranks' by more than the rank margin."""
    cal = Calibrator(timer=clock, rank_margin=0.25, budget_s=10)
    ranks = {"1": 1, "s1": 1, "2": 2, "s2": 2}

    def pick(key: str, costs: dict[str, float]) -> str:
        cands = {name: clock.cost(cost) for name, cost in costs.items()}
        return cal.choose(key, cands, nbytes=1, ranks=ranks)

    assert pick("a", {"1": 1.0, "2": 0.9, "s1": 0.95, "s2": 0.9}) == "s1"  # the rank's fastest
    assert "preferred within 25% of 2" in cal.choices()[0].reason
    assert pick("b", {"1": 1.0, "2": 0.9, "s1": 1.0, "s2": 0.9}) == "1"  # a tie: the earlier
    assert pick("c", {"1": 1.3, "2": 1.0, "s1": 1.26, "s2": 0.99}) == "s2"  # rank 1 too slow
    assert pick("d", {"1": 1.3, "2": 1.0, "s1": 1.26, "s2": 1.01}) == "2"
    # without ranks: each candidate its own rank, in order (1 within 25% of s2's 0.9)
    cands = {n: clock.cost(c) for n, c in {"1": 1.1, "2": 1.2, "s1": 1.0, "s2": 0.9}.items()}
    assert cal.choose("f", cands, nbytes=1) == "1"
    exact = FakeClock()  # dyadic times on a fresh clock: exactly at the margin is within it
    costs = {"1": 1.5, "2": 1.125, "s1": 1.25, "s2": 1.0}
    cands = {name: exact.cost(cost) for name, cost in costs.items()}
    edge = Calibrator(timer=exact, rank_margin=0.25, budget_s=10)
    assert edge.choose("e", cands, nbytes=1, ranks=ranks) == "s1"


def test_ranks_ask_the_rank_margin_and_an_order_the_margin(clock: FakeClock) -> None:
    """The same two times: with ranks (the CPU thread counts) the later rank needs more
    than ``rank_margin``; in preference order (the CUDA paths) more than ``margin``. The
    defaults: 10% between ranks, 25% in order."""
    assert (Calibrator().rank_margin, Calibrator().margin) == (0.10, 0.25)
    cal = Calibrator(timer=clock, margin=0.5, rank_margin=0.1, budget_s=10)
    ranks = {"1": 1, "2": 2}
    costs = {"1": 1.2, "2": 1.0}
    assert cal.choose("r", {n: clock.cost(c) for n, c in costs.items()}, 1, ranks=ranks) == "2"
    assert cal.choose("o", {n: clock.cost(c) for n, c in costs.items()}, 1) == "1"
    assert "preferred within 50% of 2" in cal.choices()[0].reason
    costs = {"1": 1.09, "2": 1.0}  # within 10%: the earlier rank
    assert cal.choose("s", {n: clock.cost(c) for n, c in costs.items()}, 1, ranks=ranks) == "1"
    assert "preferred within 10% of 2" in cal.choices()[2].reason


def test_ranks_must_name_every_candidate(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, budget_s=10)
    cands = {"1": clock.cost(1.0), "2": clock.cost(0.5), "x": clock.cost(0.1)}
    with pytest.raises(ValueError, match=r"k: no rank for candidate\(s\) 2, x"):
        cal.choose("k", cands, nbytes=1, ranks={"1": 1})
    assert cal.choices() == [] and clock.now == 0.0  # nothing measured
    assert cal.choose("k", cands, nbytes=1, ranks={"1": 1, "2": 1, "x": 1, "y": 2}) == "x"


def test_the_budget_bounds_the_rounds(clock: FakeClock) -> None:
    calls: list[str] = []

    def cand(name: str) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            clock.now += 1.0

        return run

    Calibrator(timer=clock, rounds=5, budget_s=0.5).choose("k", {"x": cand("x"), "y": cand("y")}, 1)
    assert calls == ["x", "y", "x", "y"]  # warm-up and one timed round, then over budget


def test_settle_runs_untimed_before_every_candidate_call(clock: FakeClock) -> None:
    """``settle`` (waiting out an OpenMP team's spinning workers) runs before each
    candidate call, warm-up included, after ``cold``, and its time is not charged."""
    calls: list[str] = []

    def cand(name: str, cost: float) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            clock.now += cost

        return run

    def settle() -> None:
        calls.append("settle")
        clock.now += 5.0

    cal = Calibrator(timer=clock, rounds=2, budget_s=100, settle=settle)
    cands = {"a": cand("a", 1.0), "b": cand("b", 0.5)}
    assert cal.choose("k", cands, nbytes=1, cold=lambda: calls.append("cold")) == "b"
    assert calls == ["cold", "settle", "a", "cold", "settle", "b"] * 3
    assert cal.choices()[0].seconds == {"a": 1.0, "b": 0.5}
    assert Calibrator().settle is None  # only the process's calibrator waits
    assert _calibrate.default_calibrator().settle is _busy.settle


def test_the_budget_counts_every_timed_call_from_zero(clock: FakeClock) -> None:
    """Rounds stop once the candidates' time so far is over the budget, warm-up round
    included; time exactly at the budget goes on."""
    calls: list[str] = []

    def cand(name: str) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            clock.now += 0.5

        return run

    cal = Calibrator(timer=clock, rounds=5, budget_s=2.0)
    cal.choose("k", {"x": cand("x"), "y": cand("y")}, 1)
    assert calls == ["x", "y"] * 3  # 1.0 s after the warm-up, 2.0 s (at the budget), 3.0 s


def test_a_known_key_is_not_measured_again(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, budget_s=10)
    cal.choose("k", {"1": clock.cost(1.0), "2": clock.cost(2.0)}, nbytes=1)

    def boom() -> None:
        raise AssertionError("measured again")

    assert cal.choose("k", {"1": boom, "2": boom}, nbytes=1) == "1"
    # a candidate set without the known choice is measured anew
    assert cal.choose("k", {"3": clock.cost(1.0)}, nbytes=1) == "3"


def test_far_slower_copies_make_the_key_stale_and_it_is_re_measured(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, drop=0.4, strikes=2, min_interval_s=5.0, budget_s=10)
    cal.choose("k", {"1": clock.cost(0.5), "2": clock.cost(2.0)}, nbytes=1_000_000_000)  # 2 GB/s
    assert not cal.observe("k", 1_000_000_000, 1.0)  # the first real copy: 1 GB/s, the figure
    assert not cal.observe("k", 1_000_000_000, 2.0)  # 0.5 GB/s: above 0.4 x
    assert not cal.observe("k", 1_000_000_000, 4.0)  # first strike
    assert not cal.observe("k", 1_000_000_000, 1.0)  # a good one resets the strikes
    assert not cal.observe("k", 1_000_000_000, 4.0)
    clock.now += 1.0
    assert not cal.observe("k", 1_000_000_000, 4.0)  # two strikes, but too soon after measuring
    clock.now += 10.0
    assert cal.observe("k", 1_000_000_000, 4.0)  # stale now
    assert not cal.observe("k", 1_000_000_000, 4.0)  # already stale
    # the load changed: "2" is now the faster one
    assert cal.choose("k", {"1": clock.cost(8.0), "2": clock.cost(2.0)}, nbytes=1) == "2"
    (choice,) = cal.choices()
    assert choice.source == "re-measured"
    assert choice.reason.startswith("2 (fastest; slowest rounds 1: 8000.000 ms")
    assert "; re-measured: observed 0.25 GB/s < 0.4 x the best since measured, 1 GB/s" in (
        choice.reason
    )
    clock.now += 10.0  # the figure starts again from the new measurement: the old best and
    assert not cal.observe("k", 1_000_000_000, 4.0)  # strikes are forgotten (0.25 GB/s is
    assert not cal.observe("k", 1_000_000_000, 4.0)  # no strike against 1 GB/s any more)
    assert not cal.observe("unknown", 1, 1.0) and not cal.observe("k", 1, 0.0)
    assert cal.current("k") == "2" and cal.current("unknown") is None


def test_a_choice_slow_from_its_first_real_copy_is_measured_again(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, drop=0.25, strikes=3, min_interval_s=0.0, budget_s=10)
    cands = {"0": clock.cost(0.125), "1": clock.cost(1.0)}
    assert cal.choose("k", cands, nbytes=1_000_000_000) == "0"  # 8 GB/s on the sample
    # every real copy at 0.5 GB/s: below 0.25 x half the sample's figure (4 GB/s)
    assert [cal.observe("k", 1_000_000_000, 2.0) for _ in range(3)] == [False, False, True]


def test_a_faster_real_copy_raises_the_figure(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, drop=0.4, strikes=1, min_interval_s=0.0, budget_s=10)
    cal.choose("k", {"1": clock.cost(1.0)}, nbytes=1)
    assert not cal.observe("k", 1_000_000_000, 1.0)  # 1 GB/s
    assert not cal.observe("k", 1_000_000_000, 0.25)  # 4 GB/s: the new figure
    assert cal.observe("k", 1_000_000_000, 1.0)  # 1 GB/s < 0.4 x 4: stale
    assert cal.current("k") is None


def test_one_candidate_is_chosen_without_timing(clock: FakeClock) -> None:
    def boom() -> None:
        raise AssertionError("timed")

    cal = Calibrator(timer=clock)
    clock.now = 7.0
    assert cal.choose("k", {"only": boom}, nbytes=3) == "only"
    only = CopyChoice("k", "only", {"only": 1.0}, 3, "measured", "only (only candidate)", 7.0)
    assert cal.choices() == [only]
    cal.forget()
    assert cal.choices() == []
    assert cal.choose("k", {"only": boom}, nbytes=3, confirm=True) == "only"  # no trial
    assert cal.confirming() == ([], 0) and cal.choices() == [only]


# ------------------------------------------------------------------ disk cache
def _doc(entries: object, host: object = None) -> str:
    return json.dumps(
        {"format": FORMAT, "host": host_id() if host is None else host, "entries": entries}
    )


def test_a_cached_choice_is_used_without_measuring(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "cal.json"
    cache = DiskCache(path)
    Calibrator(timer=clock, cache=cache, budget_s=10).choose(
        "k", {"1": clock.cost(3.0), "2": clock.cost(1.0)}, nbytes=8
    )
    assert json.loads(path.read_text())["entries"]["k"]["choice"] == "2"

    def boom() -> None:
        raise AssertionError("measured")

    fresh = Calibrator(timer=clock, cache=DiskCache(path))
    assert fresh.choose("k", {"1": boom, "2": boom}, nbytes=8) == "2"
    (choice,) = fresh.choices()
    assert choice.source == "disk cache" and str(path) in choice.reason


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "\xff\xfe",
        "[]",
        json.dumps({"format": "other", "host": host_id(), "entries": {}}),
        _doc({"k": {"choice": "2", "seconds": {"2": 1.0}, "nbytes": 8}}, host={"cpu": "elsewhere"}),
        _doc([]),
        _doc({"k": {"choice": "9", "seconds": {"2": 1.0}, "nbytes": 8}}),
        _doc({"k": {"choice": "2", "seconds": {"2": -1.0}, "nbytes": 8}}),
        _doc({"k": {"choice": "2", "seconds": {"2": True}, "nbytes": 8}}),
        _doc({"k": {"choice": "2", "seconds": {"2": 1.0}, "nbytes": 0}}),
        _doc({"k": {"choice": "2", "seconds": {"2": 1.0}, "nbytes": "8"}}),
        _doc({"k": {"choice": "2", "seconds": {"2": 1e999}, "nbytes": 8}}),
        _doc({"k": "2"}),
        _doc({"ok": {"choice": "1", "seconds": {"1": 1.0}, "nbytes": 8}, "k": {"choice": 2}}),
    ],
)
def test_a_corrupt_or_foreign_cache_file_is_ignored(
    tmp_path: Path, clock: FakeClock, text: str
) -> None:
    path = tmp_path / "cal.json"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    assert DiskCache(path).load() == {}
    cal = Calibrator(timer=clock, cache=DiskCache(path), budget_s=10)
    assert cal.choose("k", {"1": clock.cost(1.0), "2": clock.cost(5.0)}, nbytes=8) == "1"
    assert cal.choices()[0].source == "measured"
    assert set(DiskCache(path).load()) == {"k"}  # rewritten whole


def test_the_host_document_names_what_a_cached_choice_depends_on() -> None:
    """Its keys are the file format's (a file another process wrote must compare equal)."""
    assert host_id() == {
        "cpu": _calibration_cache._cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "stream": stream_copy_status(),
    }


def test_a_cache_written_with_another_streaming_kernel_is_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clock: FakeClock
) -> None:
    """The host names the streaming copy's kernel: choices measured with one (or with
    none) do not apply to a process that maps another."""
    path = tmp_path / "cal.json"
    monkeypatch.setattr(_calibration_cache, "stream_copy_status", lambda: "available (avx2)")
    cache = DiskCache(path)
    cache.store(CopyChoice("k", "1", {"1": 1.0}, 8, "measured", "1"))
    assert set(DiskCache(path).load()) == {"k"}
    doc = json.loads(path.read_text())
    assert doc["host"]["stream"] == "available (avx2)"
    monkeypatch.setattr(_calibration_cache, "stream_copy_status", lambda: "available (sse2)")
    assert DiskCache(path).load() == {}


def test_an_unwritable_cache_path_only_loses_the_cache(tmp_path: Path, clock: FakeClock) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = DiskCache(blocker / "sub" / "cal.json")  # parent is a file: cannot be created
    cache.store(CopyChoice("k", "1", {"1": 1.0}, 8, "measured", "1"))
    assert cache.load() == {}
    assert list(tmp_path.iterdir()) == [blocker]


def test_the_env_var_names_the_cache_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert DiskCache.from_env() is None
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "c.json"))
    cache = DiskCache.from_env()
    assert cache is not None and cache.path == tmp_path / "c.json"


# ------------------------------------------------------- the pools' copies
@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fresh process calibrator on a fake clock: every candidate takes one tick."""
    clock = FakeClock()

    def tick() -> float:
        clock.now += 1.0
        return clock.now

    monkeypatch.setattr(_calibrate, "_default", Calibrator(timer=tick, budget_s=1e9))
    return clock


def _round_trip(tuning: CopyTuning | None, layout: str = "page_first") -> None:
    backend = sgl_core.TorchBackend(tuning=tuning)
    kw = dict(
        size=2048,
        page_size=64,
        dtype=torch.bfloat16,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        layer_num=2,
    )
    dev, back = backend.create_device_pool(**kw), backend.create_device_pool(**kw)  # type: ignore[arg-type]
    fill_device_random(dev, 5)
    host = backend.create_host_pool(dev, layout=layout)
    h_idx = page_indices([3, 1, 7, 0, 5, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29], 64)
    d_idx = page_indices(list(range(2, 18)), 64)  # 1024 tokens x 2 layers x 1152 B = 2.4 MB
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    for layer in range(2):
        host.load_to_device_per_layer(back, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(back, layer, d_idx), device_rows(dev, layer, d_idx))


def test_the_default_tuning_calibrates_big_copies(fresh: FakeClock) -> None:
    _round_trip(None)
    keys = [c.key for c in copy_calibration()]
    assert keys and all(k.split()[1] == "cpu->cpu" for k in keys)
    # equal ticks: the preferred thread count (a stacked backup's path key is a choice
    # between two strategies, tested in test_load_steps)
    threads = [c for c in copy_calibration() if not c.key.startswith("stacked ")]
    assert threads and all(c.choice == "1" for c in threads)


def test_an_explicit_copy_threads_wins(fresh: FakeClock) -> None:
    for threads in (0, 1, 2):
        _round_trip(CopyTuning(copy_threads=threads))
    assert copy_calibration() == []
    _round_trip(CopyTuning())  # an explicit tuning with copy_threads AUTO asks the calibrator
    assert copy_calibration() != []


def test_a_real_copy_exactly_at_the_drop_is_no_strike(clock: FakeClock) -> None:
    """The figure is at least half the sample's GB/s (2 GB/s here: 1 GB/s); a copy at
    exactly ``drop`` x that (0.25 GB/s) is no strike, one below it is."""
    cal = Calibrator(timer=clock, drop=0.25, strikes=1, min_interval_s=0.0, budget_s=10)
    cal.choose("k", {"x": clock.cost(1.0), "y": clock.cost(4.0)}, 2_000_000_000)
    assert not cal.observe("k", 250_000_000, 1.0)
    assert cal.current("k") == "x"
    assert cal.observe("k", 200_000_000, 1.0)  # 0.2 GB/s < 0.25: stale
    assert cal.current("k") is None


def test_a_good_copy_clears_the_strikes(clock: FakeClock) -> None:
    cal = Calibrator(timer=clock, drop=0.25, strikes=2, min_interval_s=0.0, budget_s=10)
    cal.choose("k", {"x": clock.cost(1.0), "y": clock.cost(4.0)}, 1_000_000_000)
    assert not cal.observe("k", 1, 1.0)  # strike 1
    assert not cal.observe("k", 1_000_000_000, 1.0)  # as fast as measured: strikes cleared
    assert not cal.observe("k", 1, 1.0)  # strike 1 again, not 2
    assert cal.current("k") == "x"
    assert cal.observe("k", 1, 1.0)  # strike 2: stale
