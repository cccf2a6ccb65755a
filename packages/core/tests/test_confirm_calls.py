"""A close copy calibration confirmed on the key's own real calls (issue #27): which
candidates contend, how turns alternate, what a timed call may record, the verdict, the
disk cache, and an AUTO copy that runs the turns.

No timed assertions: durations are scripted on fake clocks; the copies are checked for
their bytes and for which candidate ran.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sgl_core.cli._hicache import settle_calibration
from sgl_core.transfer.copy import _auto_copy, _busy, _calibrate, _copy
from sgl_core.transfer.copy._auto_copy import _bucket, thread_ranks
from sgl_core.transfer.copy._calibrate import Calibrator, CopyChoice, DiskCache
from sgl_core.transfer.copy._copy import copy_blocks
from sgl_core.transfer.copy._decide import Trial, Trials, confirmed, contenders
from sgl_core.transfer.copy._turns import confirm_call


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def cost(
        self, seconds: float, ran: list[str] | None = None, name: str = ""
    ) -> Callable[[], None]:
        def run() -> None:
            self.now += seconds
            if ran is not None:
                ran.append(name)

        return run


# ---------------------------------------------------------------- contenders, Trial


def test_contenders_are_the_candidates_within_the_bound_of_the_fastest() -> None:
    seconds = {"1": 1.5, "2": 1.0, "0": 1.75, "stream1": 4.0}
    assert contenders(seconds, "2", 0.5) == ["1", "2"]  # 1.5 is exactly 1.5 x 1.0: in
    assert contenders(seconds, "2", 0.75) == ["1", "2", "0"]  # in the sample's order
    assert contenders(seconds, "stream1", 0.5) == ["1", "2", "stream1"]  # the choice always
    assert contenders(seconds, "2", 0.25) == []  # one left: nothing to confirm
    assert contenders({"1": 1.0}, "1", 10.0) == []


def test_a_trial_alternates_its_contenders_and_ends_after_each_ran_its_calls() -> None:
    trial = Trial(order=["a", "b", "c"], calls=2)
    ran = []
    for _ in range(6):
        assert not trial.done()
        name = trial.turn()
        ran.append(name)
        trial.record(name, 100, 1.0)
    assert ran == ["a", "b", "c"] * 2 and trial.done()


def test_a_trial_ignores_other_names_and_empty_calls() -> None:
    trial = Trial(order=["a", "b"], calls=1)
    assert not trial.record("z", 100, 1.0)
    assert not trial.record("a", 100, 0.0)
    assert not trial.record("a", 0, 1.0)
    assert not trial.record("a", 100, -1.0)
    assert trial.timed == {"a": [], "b": []} and trial.turn() == "a"
    assert trial.record("a", 1, 1e-9)
    assert trial.timed["a"] == [(1, 1e-9)] and trial.turn() == "b"


def test_a_withdrawn_contender_leaves_the_trial() -> None:
    trial = Trial(order=["a", "b", "c"], calls=1)
    trial.record("a", 100, 1.0)
    trial.withdraw("a")
    trial.withdraw("z")  # not a contender: nothing changes
    assert trial.order == ["b", "c"] and trial.timed == {"b": [], "c": []}
    assert trial.ran == {"b": 0, "c": 0}
    assert not trial.done() and trial.turn() == "b"
    trial.withdraw("c")
    assert trial.done()  # one left


def test_the_warm_up_calls_run_in_turn_untimed() -> None:
    """The calls of the first 1.5 s, both contenders' together, alternate and count as
    recorded, but only the later ones are timed."""
    trial = Trial(order=["a", "b"], calls=2, warmup_s=1.5)
    ran = []
    for seconds in (1.0, 1.0, 0.5, 0.7, 0.5, 0.7):  # the warm-up ends after the second
        ran.append(trial.turn())
        assert trial.record(ran[-1], 10, seconds)
    assert ran == ["a", "b", "a", "b", "a", "b"] and trial.done()
    assert trial.timed == {"a": [(10, 0.5)] * 2, "b": [(10, 0.7)] * 2}
    assert trial.ran == {"a": 3, "b": 3} and trial.warm == 2.0
    assert not trial.record("c", 10, 1.0) and not trial.record("a", 10, 0.0)
    assert trial.ran == {"a": 3, "b": 3}  # an ignored call is no call


def test_after_the_warm_up_the_fewest_timed_calls_go_first() -> None:
    """A warm-up that ends after an odd number of calls: b, with fewer calls, goes first,
    and then they alternate again."""
    trial = Trial(order=["a", "b"], calls=2, warmup_s=1.0)
    trial.record("a", 10, 1.0)  # the whole warm-up
    turns = []
    for _ in range(4):
        turns.append(trial.turn())
        trial.record(turns[-1], 10, 0.5)
    assert turns == ["b", "a", "b", "a"] and trial.done()


def test_a_contender_on_several_threads_runs_in_pairs_timed_the_second_time() -> None:
    """Ranks are thread counts: b (2) and c (0, ATen's team: the last rank, 3) run twice
    in a row after the warm-up, their first call of a pair untimed; a (1) once."""
    trial = Trial(order=["a", "b", "c"], calls=2, ranks={"a": 1, "b": 2, "c": 3}, warmup_s=0.5)
    ran, costs = [], {"a": 1.0, "b": 0.9, "c": 0.8}
    while not trial.done():
        ran.append(trial.turn())
        assert trial.record(ran[-1], 10, costs[ran[-1]] + 0.1 * (ran[-2:] != ran[-1:] * 2))
    # the warm-up: a (not a pair's); then by the fewest timed calls, then calls: b b, c c,
    # a, and a again (its warm-up call was a call), b b, c c
    assert ran == ["a", "b", "b", "c", "c", "a", "a", "b", "b", "c", "c"]
    assert trial.timed == {"a": [(10, 1.1), (10, 1.0)], "b": [(10, 0.9)] * 2, "c": [(10, 0.8)] * 2}
    assert trial.ran == {"a": 3, "b": 4, "c": 4} and trial.lead == ""


def test_a_withdrawn_or_ignored_first_call_of_a_pair_leaves_no_pair() -> None:
    trial = Trial(order=["a", "b", "c"], calls=1, ranks={"a": 1, "b": 2, "c": 2})
    trial.record("a", 10, 1.0)
    assert trial.turn() == "b" and trial.record("b", 10, 1.0)  # the first of b's pair
    assert trial.lead == "b" and trial.turn() == "b" and not trial.timed["b"]
    trial.withdraw("b")
    assert trial.turn() == "c" and not trial.record("c", 10, 0.0)  # ignored: no pair
    assert trial.lead == "b" and trial.turn() == "c"


def test_the_seconds_of_the_mean_call_are_each_contenders_median_per_byte() -> None:
    trial = Trial(order=["a", "b", "c"], calls=2)
    trial.record("a", 100, 1.0)  # 0.01 s a byte
    trial.record("a", 300, 2.0)  # 0.00667 s a byte: an even count's median is the middle two's mean
    trial.record("b", 200, 1.0)
    seconds, mean = trial.seconds()
    assert mean == 200  # (100 + 300 + 200) // 3 calls
    assert seconds == pytest.approx({"a": (1.0 / 100 + 2.0 / 300) / 2 * 200, "b": 1.0})
    assert list(seconds) == ["a", "b"]  # c never ran
    assert Trial(order=["a"], calls=1).seconds() == ({}, 0)
    one = Trial(order=["a", "b"], calls=2)
    one.record("a", 101, 2.0)
    assert one.seconds() == ({"a": 2.0}, 101)  # one call: its own bytes
    one.record("a", 100, 2.0)
    seconds, mean = one.seconds()
    assert mean == 100 and isinstance(mean, int)  # 201 // 2: whole bytes
    assert seconds == pytest.approx({"a": (2.0 / 101 + 2.0 / 100) / 2 * 100})


def test_one_slow_call_does_not_decide_a_trial_but_most_slow_calls_do() -> None:
    trial = Trial(order=["a", "b"], calls=3)
    for t in (1.0, 9.0, 1.0):  # one hiccup: a's mean (3.67) is b's worse, its median is not
        trial.record("a", 100, t)
        trial.record("b", 100, 2.0)
    seconds, _ = trial.seconds()
    assert seconds == pytest.approx({"a": 1.0, "b": 2.0})
    assert confirmed(seconds, "b", 0.10, None)[0] == "a"
    slow = Trial(order=["a", "b"], calls=3)
    for t in (9.0, 1.0, 9.0):  # slow on two calls of three: a loses
        slow.record("a", 100, t)
        slow.record("b", 100, 2.0)
    seconds, _ = slow.seconds()
    assert seconds == pytest.approx({"a": 9.0, "b": 2.0})
    assert confirmed(seconds, "a", 0.10, None)[0] == "b"


# ---------------------------------------------------------------- Trials


def _open(trials: Trials, key: str, order: list[str]) -> None:
    trials.open[key] = Trial(order=order, calls=1)


def test_a_call_counts_only_after_its_own_turn() -> None:
    trials = Trials()
    _open(trials, "k", ["a", "b"])
    assert trials.record("k", "a", 10, 1.0) is None  # no turn asked: not recorded
    assert trials.open["k"].timed == {"a": [], "b": []} and trials.recorded == 0
    assert trials.turn("k") == "a"
    assert trials.record("k", "a", 10, 1.0) is None
    assert trials.open["k"].timed["a"] == [(10, 1.0)] and trials.recorded == 1
    assert trials.record("k", "b", 10, 1.0) is None  # that turn was used: not recorded
    assert trials.turn("k") == "b"
    done = trials.record("k", "b", 10, 2.0)
    assert done is not None and done.timed == {"a": [(10, 1.0)], "b": [(10, 2.0)]}
    assert "k" not in trials.open and trials.recorded == 2
    assert trials.turn("k") is None and trials.record("k", "a", 10, 1.0) is None


def test_a_call_with_a_nested_trial_call_inside_is_not_recorded() -> None:
    """A stacked backup's path (outer) runs its slices step (inner, confirmed too): the
    outer call's time holds an inner contender's, so only the inner one counts."""
    trials = Trials()
    _open(trials, "outer", ["runs", "slices"])
    _open(trials, "inner", ["1", "2"])
    assert trials.turn("outer") == "runs"
    assert trials.turn("inner") == "1"
    trials.record("inner", "1", 10, 1.0)
    trials.record("outer", "runs", 10, 3.0)
    assert trials.open["outer"].timed == {"runs": [], "slices": []}
    assert trials.open["inner"].timed["1"] == [(10, 1.0)]
    assert trials.turn("outer") == "runs"  # asked again: this time nothing nested
    trials.record("outer", "runs", 10, 2.0)
    assert trials.open["outer"].timed["runs"] == [(10, 2.0)]
    assert trials.turn("outer") == "slices"
    assert trials.turn("inner") == "2"
    trials.record("inner", "2", 10, 0.0)  # ignored (no time): it voids nothing
    done = trials.record("outer", "slices", 10, 2.0)  # each ran once: over
    assert done is not None and done.timed["slices"] == [(10, 2.0)] and trials.recorded == 3
    _open(trials, "outer", ["runs", "slices"])  # nested again, after three records
    assert trials.turn("outer") == "runs"
    assert trials.turn("inner") == "2"
    trials.record("inner", "2", 10, 1.0)
    trials.record("outer", "runs", 10, 3.0)
    assert trials.open["outer"].timed["runs"] == [] and trials.recorded == 4


def test_another_threads_calls_do_not_void_this_threads_turn() -> None:
    trials = Trials()
    _open(trials, "k", ["a", "b"])
    _open(trials, "j", ["x", "y"])
    assert trials.turn("k") == "a"

    def other() -> None:
        assert trials.turn("j") == "x"
        trials.record("j", "x", 10, 1.0)
        trials.record("k", "b", 10, 1.0)  # no turn of k on that thread: not recorded

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    trials.record("k", "a", 10, 1.0)
    assert trials.open["k"].timed == {"a": [(10, 1.0)], "b": []}
    assert trials.open["j"].timed["x"] == [(10, 1.0)] and trials.recorded == 2


def test_no_turn_is_given_while_the_thread_measures() -> None:
    trials = Trials()
    _open(trials, "k", ["a", "b"])
    with trials.measuring():
        with trials.measuring():
            assert trials.turn("k") is None
        assert trials.turn("k") is None
    assert trials.turn("k") == "a"


def test_withdrawing_the_last_but_one_contender_closes_the_trial() -> None:
    trials = Trials()
    assert trials.withdraw("k", "a", "a") is None  # no trial
    _open(trials, "k", ["a", "b", "c"])
    assert trials.withdraw("k", "a", "c") is None and trials.open["k"].order == ["b", "c"]
    done = trials.withdraw("k", "b", "c")
    assert done is not None and done.order == ["c"] and "k" not in trials.open


def test_withdrawing_the_samples_choice_ends_the_trial_empty() -> None:
    """Without the sample's choice the others do not decide among themselves: the trial
    ends with nothing timed (the calibrator keeps the sample's choice)."""
    trials = Trials()
    _open(trials, "k", ["a", "b", "c"])
    assert trials.turn("k") == "a"
    trials.record("k", "a", 10, 1.0)
    done = trials.withdraw("k", "c", "c")
    assert done is not None and done.order == [] and done.timed == {}
    assert done.seconds() == ({}, 0) and "k" not in trials.open


def test_a_withdrawn_turn_is_void_and_a_mark_names_its_contender() -> None:
    trials = Trials()
    _open(trials, "k", ["a", "b", "c"])
    assert trials.turn("k") == "a"
    trials.withdraw("k", "c", None)  # this thread's turn of k is void
    trials.record("k", "a", 10, 1.0)
    assert trials.open["k"].timed["a"] == [] and trials.recorded == 0
    assert trials.turn("k") == "a"
    trials.record("k", "b", 10, 1.0)  # not the contender the turn named
    assert trials.open["k"].timed == {"a": [], "b": []} and trials.recorded == 0


def test_the_call_that_measured_gets_no_turn_once() -> None:
    """``sampled``: this thread's next turn of that key is void (the call that ran the
    sample runs its choice, untimed: its bytes are cache-hot), once; other keys and other
    threads' turns are given; inside a measurement the void turn waits for the real call."""
    trials = Trials()
    _open(trials, "k", ["a", "b"])
    _open(trials, "j", ["a", "b"])
    trials.sampled("k")
    assert trials.turn("j") == "a"  # another key
    other: list[str | None] = []
    worker = threading.Thread(target=lambda: other.append(trials.turn("k")))
    worker.start()
    worker.join()
    assert other == ["a"]  # another thread
    with trials.measuring():
        assert trials.turn("k") is None
    assert trials.turn("k") is None  # the void turn, after the measurement
    trials.record("k", "a", 10, 1.0)
    assert trials.open["k"].timed["a"] == []  # no turn given: nothing recorded
    assert trials.turn("k") == "a"  # once only


def test_a_trial_starts_after_the_call_that_measured(clock: Clock) -> None:
    """``choose`` opens the trial and voids the measuring thread's next turn; another
    thread's real call takes a turn at once."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    cal.choose("k", {"x": clock.cost(1.0), "y": clock.cost(1.2)}, 100, confirm=True)
    other: list[str | None] = []
    worker = threading.Thread(target=lambda: other.append(cal.turn("k")))
    worker.start()
    worker.join()
    assert other == ["x"] and cal.turn("k") is None and cal.turn("k") == "x"


def test_nothing_is_recorded_while_the_thread_measures() -> None:
    """A mark left by a turn that was never reported (a skipped or failed call) does not
    let a call made inside a sample count."""
    trials = Trials()
    _open(trials, "k", ["a", "b"])
    assert trials.turn("k") == "a"
    with trials.measuring():
        trials.record("k", "a", 10, 1.0)
    assert trials.open["k"].timed["a"] == [] and trials.recorded == 0


# ---------------------------------------------------------------- the calibrator

# (confirm_warmup_s=0: the trials below time their first calls; the warm-up has its own tests)


def _close_sample(clock: Clock, cal: Calibrator, confirm: bool = True) -> str:
    """x 1.0 s and y 1.2 s a sample (one rank each): x chosen, y within 50%."""
    cands = {"x": clock.cost(1.0), "y": clock.cost(1.2)}
    if not confirm:  # choose's default
        return cal.choose("k", cands, 100)
    chosen = cal.choose("k", cands, 100, confirm=True)
    assert cal.turn("k") is None  # the call that measured runs the sample's choice, untimed
    return chosen


def _real_call(clock: Clock, cal: Calibrator, costs: dict[str, float], nbytes: int = 100) -> str:
    name = cal.turn("k") or cal.current("k") or ""
    start = clock()
    clock.now += costs[name]
    cal.observe("k", nbytes, clock() - start, ran=name)
    return name


def test_a_close_sample_is_decided_by_the_real_calls(clock: Clock, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cal.json")
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, cache=cache)
    assert _close_sample(clock, cal) == "x"
    assert cal.confirming() == (["k"], 0) and cal.current("k") == "x"
    assert cache.load() == {}  # written once confirmed
    costs = {"x": 3.0, "y": 1.0}  # the whole calls rank them the other way
    ran = [_real_call(clock, cal, costs) for _ in range(7)]
    assert ran == ["x", "y"] * 3 + ["y"]  # confirm_calls: 3 apiece
    assert cal.confirming() == ([], 6) and cal.current("k") == "y"
    (choice,) = cal.choices()
    assert choice.source == "confirmed" and choice.choice == "y"
    assert choice.seconds == pytest.approx({"x": 3.0, "y": 1.0}) and choice.nbytes == 100
    assert choice.measured_at == pytest.approx(clock.now - 1.0)  # settled, then one call
    assert choice.reason.startswith("y (fastest; real calls x: 3000.000 ms, y: 1000.000 ms)")
    assert "the sample chose x (fastest; slowest rounds" in choice.reason
    stored = json.loads((tmp_path / "cal.json").read_text())["entries"]["k"]
    assert stored["choice"] == "y" and stored["seconds"] == pytest.approx({"x": 3.0, "y": 1.0})


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_the_real_calls_keep_the_margin_for_a_later_rank(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    _close_sample(clock, cal)
    for _ in range(6):  # y is 15% faster on the real calls: within the 25% margin
        _real_call(clock, cal, {"x": 1.0, "y": 0.85})
    (choice,) = cal.choices()
    assert choice.choice == "x" and "preferred within 25% of y; real calls" in choice.reason


@pytest.mark.parametrize(("y", "choice"), [(0.75, "y"), (0.8, "x"), (0.9, "x")])
def test_the_sample_stays_unless_the_real_calls_beat_it_by_the_margin(
    clock: Clock, y: float, choice: str
) -> None:
    """One rank: the real calls' fastest must be more than the rank margin (25% here)
    faster than the sample's choice to overrule it (x 1.0 s: 0.8 s is exactly 25% faster
    and does not)."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, rank_margin=0.25)
    cands = {"x": clock.cost(1.0), "y": clock.cost(1.125)}
    assert cal.choose("k", cands, 100, ranks={"x": 1, "y": 1}, confirm=True) == "x"
    assert cal.turn("k") is None  # the measuring call: no turn
    for _ in range(6):
        _real_call(clock, cal, {"x": 1.0, "y": y})
    (got,) = cal.choices()
    assert got.choice == choice and got.source == "confirmed"
    if choice == "x":
        assert got.reason.startswith("x (kept within 25% of y; real calls x: 1000.000 ms")


@pytest.mark.parametrize(("ranks", "choice"), [({"x": 1, "y": 2}, "y"), (None, "x")])
def test_the_real_calls_ask_the_keys_own_margin(
    clock: Clock, ranks: dict[str, int] | None, choice: str
) -> None:
    """y 15% faster on the real calls: beyond the default rank margin (10%) it overrules
    the sample's x where the key has ranks (a CPU thread count), within the default
    margin (25%) it does not where the candidates are in preference order (a CUDA path).
    (With ranks, y on two threads takes its turns in pairs: 9 calls.)"""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    cands = {"x": clock.cost(1.0), "y": clock.cost(1.05)}
    assert cal.choose("k", cands, 100, ranks=ranks, confirm=True) == "x"
    assert cal.turn("k") is None  # the measuring call: no turn
    for _ in range(9):
        _real_call(clock, cal, {"x": 1.0, "y": 0.85})
    (got,) = cal.choices()
    assert got.choice == choice and got.source == "confirmed"


def test_confirmed_keeps_the_sample_only_where_it_ran() -> None:
    """``confirmed`` as the trial calls it: a sample's choice that was withdrawn (not
    timed) cannot stay; one within the margin of the real calls' choice does."""
    seconds = {"1": 1.0, "2": 0.5}
    assert confirmed(seconds, "0", 0.25, None)[0] == "2"  # "0" never ran: decide's choice
    assert confirmed(seconds, "1", 0.25, None)[0] == "2"  # 1.0 > 0.5 x 1.25
    assert confirmed({"1": 0.625, "2": 0.5}, "1", 0.25, None)[0] == "1"  # exactly: stays
    assert confirmed({"1": 0.5, "2": 0.625}, "2", 0.25, None)[0] == "2"  # exactly: stays
    assert confirmed({"1": 1.0, "2": 0.9}, "2", 0.25, None) == (
        "2",
        "2 (kept within 25% of 1; real calls 1: 1000.000 ms, 2: 900.000 ms)",
    )  # decide would keep the earlier rank within the margin: the sample's 2 stays
    assert confirmed(seconds, "2", 0.25, None) == (
        "2",
        "2 (fastest; real calls 1: 1000.000 ms, 2: 500.000 ms)",
    )


def test_no_trial_without_confirm_or_calls_or_a_close_runner_up(clock: Clock) -> None:
    plain = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    _close_sample(clock, plain, confirm=False)
    assert plain.confirming() == ([], 0) and plain.turn("k") is None
    off = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, confirm_calls=0)
    _close_sample(clock, off)
    assert off.confirming() == ([], 0) and off.choices()[0].source == "measured"
    far = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, confirm_within=0.1)
    _close_sample(clock, far)  # 1.2 is not within 10% of 1.0
    assert far.confirming() == ([], 0)


def test_the_samples_choice_contends_even_outside_the_bound(clock: Clock) -> None:
    """x, the earlier rank, is chosen within the 25% margin of y; with a 10% bound only y
    is near the fastest, and x contends anyway (a trial without the choice would be none)."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, confirm_within=0.1)
    cal.choose("k", {"x": clock.cost(1.0), "y": clock.cost(0.875)}, 100, confirm=True)
    assert cal.current("k") == "x" and cal.confirming() == (["k"], 0)
    assert cal._trials.open["k"].order == ["x", "y"]


def _rounds(clock: Clock, seconds: list[float]) -> Callable[[], None]:
    """A candidate whose calls cost ``seconds`` in turn, after an untimed 1 s warm-up."""
    costs = iter([1.0, *seconds])

    def run() -> None:
        clock.now += next(costs)

    return run


def test_one_stalled_round_does_not_keep_a_close_candidate_out_of_the_trial(
    clock: Clock,
) -> None:
    """y stalls in one round of three (a descheduled thread): its slowest round loses the
    sample, but its median round is within 50% of x's, so its real calls are tried; slow
    in two rounds of three, it stays out."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    stalled = {"x": _rounds(clock, [1.2] * 3), "y": _rounds(clock, [1.0, 5.0, 1.0])}
    assert cal.choose("k", stalled, 100, confirm=True) == "x"
    assert cal.confirming() == (["k"], 0) and cal._trials.open["k"].order == ["x", "y"]
    (choice,) = cal.choices()
    assert choice.seconds == pytest.approx({"x": 1.2, "y": 5.0})  # decided by the slowest
    tried = "; median rounds of the contenders x: 1200.000 ms, y: 1000.000 ms"
    assert choice.reason.endswith(tried)
    slow = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    twice = {"x": _rounds(clock, [1.2] * 3), "y": _rounds(clock, [1.0, 5.0, 5.0])}
    assert slow.choose("k", twice, 100, confirm=True) == "x"
    assert slow.confirming() == ([], 0) and "median rounds" not in slow.choices()[0].reason


def test_of_two_rounds_the_faster_opens_the_trial(clock: Clock) -> None:
    """The budget spent after two rounds: y's median round is the faster of its two (the
    mean, 3 s, would keep it out)."""
    cal = Calibrator(timer=clock, budget_s=5.0)
    cands = {"x": _rounds(clock, [1.2, 1.2, 9.0]), "y": _rounds(clock, [1.0, 5.0, 9.0])}
    assert cal.choose("k", cands, 100, confirm=True) == "x"
    assert cal._trials.open["k"].order == ["x", "y"]
    assert cal.choices()[0].seconds == pytest.approx({"x": 1.2, "y": 5.0})


def test_a_sample_cut_short_tries_on_its_rounds(clock: Clock) -> None:
    """With the budget spent after one round, each candidate's one round is its slowest
    and its median: y, 1.6 x the fastest, is not tried."""
    cal = Calibrator(timer=clock, budget_s=0.5)
    cands = {"x": _rounds(clock, [1.0, 9.0]), "y": _rounds(clock, [1.6, 0.1])}
    assert cal.choose("k", cands, 100, confirm=True) == "x"
    assert cal.confirming() == ([], 0)
    assert cal.choices()[0].seconds == pytest.approx({"x": 1.0, "y": 1.6})


def test_a_trial_warms_up_for_the_calibrators_seconds(clock: Clock) -> None:
    """By default the calls of a trial's first 5 ms are not timed: x's 4 ms call and y's
    2 ms call here; then 3 timed calls apiece."""
    cal = Calibrator(timer=clock, budget_s=1e9)
    _close_sample(clock, cal)
    assert cal._trials.open["k"].warmup_s == 0.005
    ran = [_real_call(clock, cal, {"x": 0.004, "y": 0.002}) for _ in range(9)]
    assert ran == ["x", "y"] * 4 + ["y"] and cal.current("k") == "y"
    assert cal.choices()[0].seconds == pytest.approx({"x": 0.004, "y": 0.002})
    assert cal.confirming() == ([], 8)  # the warm-up calls are recorded calls too
    longer = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0.25)
    _close_sample(clock, longer)
    assert longer._trials.open["k"].warmup_s == 0.25


def test_one_call_per_contender_is_a_trial(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, confirm_calls=1)
    _close_sample(clock, cal)
    ran = [_real_call(clock, cal, {"x": 1.0, "y": 2.0}) for _ in range(3)]
    assert ran == ["x", "y", "x"] and cal.choices()[0].source == "confirmed"


def test_the_calls_per_contender_are_the_calibrators(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, confirm_calls=4)
    _close_sample(clock, cal)
    ran = [_real_call(clock, cal, {"x": 1.0, "y": 2.0}) for _ in range(9)]
    assert ran == ["x", "y"] * 4 + ["x"] and cal.choices()[0].source == "confirmed"


def test_a_trial_with_one_contender_left_keeps_the_sample(clock: Clock, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cal.json")
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, cache=cache)
    _close_sample(clock, cal)
    _real_call(clock, cal, {"x": 5.0, "y": 1.0})  # x timed once
    cal.withdraw("k", "y")
    (choice,) = cal.choices()
    assert cal.confirming() == ([], 1) and choice.source == "measured" and choice.choice == "x"
    assert choice.seconds == pytest.approx({"x": 1.0, "y": 1.2})  # the sample's
    assert cache.load()["k"].choice == "x"  # cached once the trial ended
    cal.withdraw("k", "x")  # no trial: nothing happens
    assert cal.current("k") == "x"


def test_a_withdrawn_sample_choice_stands(clock: Clock, tmp_path: Path) -> None:
    """The team (the sample's choice) cannot run now: the trial ends and the sample's
    choice stands, cached; the other contenders do not decide among themselves (a
    passing busy moment must not become the lasting choice)."""
    cache = DiskCache(tmp_path / "cal.json")
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, cache=cache)
    cands = {"1": clock.cost(1.25), "2": clock.cost(1.125), "0": clock.cost(1.0)}
    assert cal.choose("k", cands, 100, ranks={"1": 0, "2": 0, "0": 0}, confirm=True) == "0"
    assert cal.turn("k") is None  # the measuring call: no turn
    assert cal.turn("k") == "1"
    cal.observe("k", 100, 2.0, ran="1")
    cal.withdraw("k", "0")
    (choice,) = cal.choices()
    assert cal.confirming() == ([], 1) and choice.choice == "0" and choice.source == "measured"
    assert cache.load()["k"].choice == "0"


def test_observe_compares_only_the_choices_own_calls(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, strikes=1, min_interval_s=0.0)
    cal.choose("k", {"x": clock.cost(1.0), "y": clock.cost(5.0)}, 100, confirm=True)
    assert cal.confirming() == ([], 0)  # y is not within 50%
    assert not cal.observe("k", 100, 1e3, ran="y")  # another candidate: not a strike
    assert cal.current("k") == "x"
    assert cal.observe("k", 100, 1e3, ran="x")  # the choice, 1000x slower: stale
    assert cal.current("k") is None


def test_a_trial_call_is_no_strike(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, strikes=1, min_interval_s=0.0)
    _close_sample(clock, cal)
    assert cal.turn("k") == "x"
    assert not cal.observe("k", 100, 1e3, ran="x")  # recorded in the trial, not compared
    assert cal.current("k") == "x" and cal._seen == {}


def test_withdrawing_from_an_unknown_key_does_nothing(clock: Clock) -> None:
    """E.g. a candidate that raised after another thread forgot every choice: the
    withdrawal must not raise over the copy's own error."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    cal.withdraw("never measured", "x")
    assert cal.choices() == [] and cal.confirming() == ([], 0)


def test_forget_ends_every_trial(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    _close_sample(clock, cal)
    cal.forget()
    assert cal.confirming() == ([], 0) and cal.turn("k") is None


def test_a_new_measurement_without_a_close_runner_up_ends_the_trial(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    _close_sample(clock, cal)
    cal._stale["k"] = "test"  # measured again: y is now far behind
    cal.choose("k", {"x": clock.cost(1.0), "y": clock.cost(9.0)}, 100, confirm=True)
    assert cal.confirming() == ([], 0) and cal.current("k") == "x"


def test_a_sample_does_not_take_a_trials_turns(clock: Clock) -> None:
    """A candidate measured by one key may run a copy another key is confirming: that key
    gives no turn inside the measurement (its choice runs, unrecorded)."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    _close_sample(clock, cal)
    inner: list[str | None] = []

    def outer_candidate() -> None:
        inner.append(cal.turn("k"))
        clock.now += 1.0

    cal.choose("outer", {"a": outer_candidate, "b": clock.cost(1.0)}, 1, confirm=True)
    assert inner == [None] * 4 and cal.turn("k") == "x"


# ---------------------------------------------------------------- callers


def test_confirm_call_runs_the_turns_then_the_verdict(clock: Clock) -> None:
    """After the trial the step keeps the verdict, drops the other candidates and asks the
    calibrator nothing more (a load must not wait for its lock, held while another thread
    measures)."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, confirm_calls=2)
    _close_sample(clock, cal)
    ran: list[str] = []
    runs = {"x": clock.cost(3.0, ran, "x"), "y": clock.cost(1.0, ran, "y")}
    settled: list[str] = []
    for _ in range(5):
        confirm_call(cal, "k", 100, runs, "x", settled)
    assert ran == ["x", "y", "x", "y", "y"] and settled == ["y"] and list(runs) == ["y"]
    cal.forget()  # the calibrator is not asked again: the kept verdict runs
    confirm_call(cal, "k", 100, runs, "x", settled)
    assert ran[-1] == "y"
    fresh: list[str] = []
    again = {"x": clock.cost(3.0, ran, "x"), "y": clock.cost(1.0, ran, "y")}
    confirm_call(cal, "k", 100, again, "x", fresh)  # nothing known: the step's sample choice
    assert ran[-1] == "x" and fresh == ["x"] and list(again) == ["x"]


def test_a_contender_that_raises_leaves_the_trial(clock: Clock) -> None:
    """A real call that raises withdraws its contender (else every later turn would hand
    it out again) and the error reaches the caller; the trial goes on without it."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0, confirm_calls=2)
    cands = {"x": clock.cost(1.0), "y": clock.cost(1.1), "z": clock.cost(1.2)}
    cal.choose("k", cands, 100, confirm=True)
    assert cal.turn("k") is None  # the measuring call: no turn

    def broken() -> None:
        raise RuntimeError("y fails on real calls")

    ran: list[str] = []
    runs = {"x": clock.cost(1.0, ran, "x"), "y": broken, "z": clock.cost(1.2, ran, "z")}
    settled: list[str] = []
    errors = 0
    for _ in range(6):
        try:
            confirm_call(cal, "k", 100, runs, "x", settled)
        except RuntimeError:
            errors += 1
    assert errors == 1 and ran == ["x", "z", "x", "z", "x"]
    assert cal.choices()[0].source == "confirmed" and set(cal.choices()[0].seconds) == {"x", "z"}


def test_confirm_call_keeps_nothing_while_the_trial_runs(clock: Clock) -> None:
    """Inside another key's measurement no turn is given, and the trial is not over: the
    call runs the sample's choice and keeps nothing."""
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    _close_sample(clock, cal)
    ran: list[str] = []
    runs = {"x": clock.cost(1.0, ran, "x"), "y": clock.cost(1.2, ran, "y")}
    settled: list[str] = []

    def outer() -> None:
        confirm_call(cal, "k", 100, runs, "x", settled)

    cal.choose("outer", {"a": outer, "b": clock.cost(9.0)}, 1)
    assert set(ran) == {"x"} and settled == [] and cal.confirming() == (["k"], 0)


def test_confirm_call_withdraws_a_contender_it_does_not_hold(clock: Clock) -> None:
    cal = Calibrator(timer=clock, budget_s=1e9, confirm_warmup_s=0)
    _close_sample(clock, cal)
    ran: list[str] = []
    settled: list[str] = []
    confirm_call(cal, "k", 100, {"y": clock.cost(1.0, ran, "y")}, "y", settled)
    assert ran == ["y"] and cal.confirming() == ([], 0)  # x withdrawn: one left, ended
    assert cal.choices()[0].source == "measured"  # y was not timed as a turn: the sample
    assert settled == ["y"]


@pytest.fixture
def cal(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Calibrator:
    # the prices below are set around a 25% margin between thread counts, 2 calls apiece
    fresh = Calibrator(
        timer=clock, budget_s=1e9, confirm_warmup_s=0, rank_margin=0.25, confirm_calls=2
    )
    monkeypatch.setattr(_calibrate, "_default", fresh)
    return fresh


def _priced_blocks(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, price: Callable[[int, int], float]
) -> tuple[list[tuple[int, int]], list[torch.Tensor], list[torch.Tensor]]:
    """Two 1.1 MB blocks (and their zeroed destinations), and ``copy_blocks`` under AUTO
    charged ``price(threads, blocks)`` on ``clock``: the (threads, blocks) of each call."""
    calls: list[tuple[int, int]] = []

    def spy(dst: list[torch.Tensor], src: list[torch.Tensor], *, threads: int = 0) -> None:
        calls.append((threads, len(dst)))
        clock.now += price(threads, len(dst))
        copy_blocks(dst, src, threads=threads)

    monkeypatch.setattr(_auto_copy, "copy_blocks", spy)
    g = torch.Generator().manual_seed(5)
    src = [torch.randint(0, 1 << 30, (4, 70000), generator=g, dtype=torch.int32) for _ in "ab"]
    return calls, [torch.zeros_like(s) for s in src], src


def test_an_auto_copy_confirms_a_close_sample_on_its_calls(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, cal: Calibrator
) -> None:
    """The sample copies one block, where one thread is within the margin of two; a whole
    call copies two, where two threads (fixed cost, cheap blocks) win clearly."""
    monkeypatch.setattr(_copy, "_workers", 1)

    def price(threads: int, blocks: int) -> float:
        return {1: 1.0 * blocks, 2: 0.6 + 0.3 * blocks, 0: 5.0 * blocks}[threads]

    calls, dst, src = _priced_blocks(monkeypatch, clock, price)
    for _ in range(8):
        for d in dst:
            d.zero_()
        copy_blocks(dst, src, threads=-1)
        assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
    whole = [t for t, n in calls if n == 2]
    # the measuring call runs the sample's 1, untimed; then 1, and 2 twice (the first
    # untimed: two threads), twice; then the verdict, 2
    assert whole == [1, *[1, 2, 2] * 2, 2]
    key = f"copy cpu->cpu {_bucket(dst[0].numel() * 4)} contiguous"
    (choice,) = cal.choices()
    assert choice.key == key and choice.source == "confirmed" and choice.choice == "2"
    assert choice.nbytes == 2 * dst[0].numel() * 4
    assert "the sample chose 1 (preferred within 25% of 2" in choice.reason


def test_a_busy_machine_withdraws_the_team_from_a_trial(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, cal: Calibrator
) -> None:
    monkeypatch.setattr(_copy, "_workers", 1)
    monkeypatch.setattr(_busy, "team_fits", lambda: False)

    def price(threads: int, blocks: int) -> float:
        return {1: 1.3, 2: 1.2, 0: 1.0}[threads] * blocks  # the team first, all close

    calls, dst, src = _priced_blocks(monkeypatch, clock, price)
    for _ in range(9):
        copy_blocks(dst, src, threads=-1)
        assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
    whole = [t for t, n in calls if n == 2]
    # the measuring call runs the sample's choice, 2, untimed; turns 1, 2 (twice: two
    # threads), then the team's: withdrawn, and the sample's runner-up without it runs (1,
    # within the margin of 2), unrecorded; then turns 1, 2 (twice); then the verdict, 2
    assert whole == [2, 1, 2, 2, 1, 1, 2, 2, 2]
    assert cal.skipped() == {f"copy cpu->cpu {_bucket(280000 * 4)} contiguous": ("1", 1)}
    (choice,) = cal.choices()
    assert choice.source == "confirmed" and set(choice.seconds) == {"1", "2"}
    assert thread_ranks(choice.seconds) == {"1": 1, "2": 2}
    # real calls: 1 at 2.6 s, 2 at 2.4 s; decide would keep 1 (the earlier rank, within
    # the margin), but the sample's 2 is within the margin of it: 2 stays
    assert choice.choice == "2" and choice.reason.startswith("2 (kept within 25% of 1;")


def _open_run(
    cal: Calibrator, key: str, choice: str, seconds: dict[str, float], order: list[str]
) -> Callable[[], list[int]]:
    """``key`` measured (``choice``, ``seconds``) with a trial of ``order`` open; a runner of
    ``_auto_copy._run`` for it (never measuring again) returning the thread counts run."""
    cal._choices[key] = CopyChoice(key, choice, seconds, 1, "measured", "")
    cal._trials.open[key] = Trial(order=order, calls=2)

    def no_sample() -> tuple[list[int], Callable[[int, int, int], None]]:
        raise AssertionError("measured again")

    def run() -> list[int]:  # no streams: the streaming copy may not copy these rows
        ran: list[int] = []
        _auto_copy._run(key, 1 << 20, no_sample, ran.append)
        return ran

    return run


def test_a_contender_a_call_does_not_offer_is_withdrawn(cal: Calibrator) -> None:
    """A gather whose rows the streaming copy may not copy offers no ``stream*``: the
    trial's ``stream1`` turn is withdrawn there and the call runs the choice."""
    key = "gather cpu->cpu test"
    run = _open_run(cal, key, "1", {"1": 1.0, "stream1": 0.9}, ["stream1", "1"])
    assert run() == [1]
    assert cal.confirming() == ([], 0)  # one contender left: over, the sample stands
    assert cal.choices()[0].source == "measured" and cal.current(key) == "1"


def test_a_team_skipped_inside_a_sample_leaves_the_trial_alone(cal: Calibrator) -> None:
    """A call inside another key's measurement gets no turn: its choice, the team, is
    skipped on a busy machine, but no trial turn of the team was given, so nothing is
    withdrawn (withdrawing the sample's choice would end the trial)."""
    key = "copy cpu->cpu test"
    run = _open_run(cal, key, "0", {"1": 1.2, "2": 1.1, "0": 1.0}, ["1", "2", "0"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_busy, "team_fits", lambda: False)
        with cal._trials.measuring():
            ran = run()
    assert ran == [1] and cal.confirming() == ([key], 0)  # skip's pick: 1, within 25% of 2
    assert cal._trials.open[key].order == ["1", "2", "0"]


def test_a_team_choice_is_kept_in_the_trial_after_an_unoffered_turn(cal: Calibrator) -> None:
    """The turn names a streaming candidate this call does not offer: that one is
    withdrawn and the call runs the choice, the team; on a busy machine the team is
    skipped for this call, but its place in the trial stays (it was not its turn)."""
    key = "gather cpu->cpu test"
    seconds = {"stream1": 1.1, "1": 1.2, "0": 1.0}
    run = _open_run(cal, key, "0", seconds, ["stream1", "1", "0"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_busy, "team_fits", lambda: False)
        ran = run()
    assert ran == [1] and cal.confirming() == ([key], 0)
    assert cal._trials.open[key].order == ["1", "0"]


def test_settling_runs_rounds_while_trials_record_calls(clock: Clock, cal: Calibrator) -> None:
    _close_sample(clock, cal)  # 2 contenders x 2 calls
    rounds: list[str] = []

    def one_round() -> None:
        rounds.append(_real_call(clock, cal, {"x": 1.0, "y": 2.0}))

    assert settle_calibration(one_round, rounds=10) == 4 and rounds == ["x", "y", "x", "y"]
    assert settle_calibration(one_round, rounds=10) == 0  # nothing open: no round
    _close_sample(clock, Calibrator(timer=clock))  # another calibrator's trial: not ours
    cal._stale["k"] = "again"
    _close_sample(clock, cal)
    assert settle_calibration(one_round, rounds=3) == 3  # the bound
    stuck: list[int] = []
    assert settle_calibration(lambda: stuck.append(1), rounds=10) == 1  # nothing recorded
    assert stuck == [1]
    cal._choices["j"] = CopyChoice("j", "b", {"a": 1.0, "b": 1.0}, 1, "measured", "")
    cal._trials.open["j"] = Trial(order=["a", "b"], calls=2)
    # a round that only ends a trial (a withdrawal) is progress too: the next round runs
    assert settle_calibration(lambda: cal.withdraw("j", "a"), rounds=10) == 2
