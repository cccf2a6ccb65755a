"""How a calibration decides (``decide``: ranks and margin), and a close one confirmed on
the key's own real calls (``contenders``, :class:`Trial`, :class:`Trials`, ``confirmed``;
the callers' side: ``_turns``; docs/design.md, "Copy threads, calibrated").

A calibrator's sample is about 1 MiB of the call, timed in a few milliseconds; a whole
call can rank the candidates otherwise (a page-1 backup's row gather: the sample took one
thread about half the time, the whole call ran 1.7x faster on two). So when the sample's
call is close, the candidates near the fastest take turns on the next real calls, and
those calls decide.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

__all__ = ["Trial", "Trials", "confirmed", "contenders", "decide", "listed", "timed_rounds"]


def timed_rounds(
    candidates: Mapping[str, Callable[[], None]],
    rounds: int,
    budget_s: float,
    timer: Callable[[], float],
    untimed: Sequence[Callable[[], None] | None],
) -> dict[str, list[float]]:
    """Each candidate's seconds in ``rounds`` timed round-robin rounds, after one untimed
    warm-up round (threads, caches, allocations), cut short once the candidates' own
    time passes ``budget_s`` (each keeps at least one round). ``untimed`` run before
    every candidate call, outside the budget (``Calibrator.choose``'s ``cold``, its
    ``settle``). A sample decides by each candidate's slowest round (a strategy that now
    and then waits for a busy core, an OpenMP team, must not win on one lucky round) and
    opens a real-call trial by the median (``contenders``)."""
    samples: dict[str, list[float]] = {c: [] for c in candidates}
    spent = 0.0
    for round_no in range(rounds + 1):
        for name, run in candidates.items():
            for before in untimed:
                if before is not None:
                    before()
            t0 = timer()
            run()
            took = timer() - t0
            spent += took
            if round_no:
                samples[name].append(took)
        if round_no and spent > budget_s:
            break
    return samples


def decide(
    seconds: Mapping[str, float],
    order: Sequence[str],
    margin: float,
    ranks: Mapping[str, int] | None = None,
    what: str = "slowest rounds",
) -> tuple[str, str]:
    """The fastest candidate of the first rank whose fastest is within ``margin`` of the
    fastest of all, and why (``what``: the times' kind). Without ``ranks`` each
    candidate is a rank of its own, in ``order``; candidates of one rank compete on
    speed alone (the earlier on a tie)."""
    best = min(seconds.values())
    rank = ranks if ranks is not None else {c: i for i, c in enumerate(order)}
    groups = [[c for c in order if rank[c] == r] for r in sorted({rank[c] for c in order})]
    leaders = (min(group, key=lambda c: seconds[c]) for group in groups)
    chosen = next(c for c in leaders if seconds[c] <= best * (1 + margin))
    fastest = min(order, key=lambda c: seconds[c])
    why = "fastest" if chosen == fastest else f"preferred within {margin:.0%} of {fastest}"
    return chosen, f"{chosen} ({why}; {what} {listed(seconds, order)})"


def listed(seconds: Mapping[str, float], order: Sequence[str]) -> str:
    """``order``'s ``seconds``, in ms: ``"a: 1.000 ms, b: 2.000 ms"``."""
    return ", ".join(f"{c}: {seconds[c] * 1e3:.3f} ms" for c in order)


def confirmed(
    seconds: Mapping[str, float], sample: str, margin: float, ranks: Mapping[str, int] | None
) -> tuple[str, str]:
    """The choice after a trial's real calls (``seconds``, in the contenders' order) and
    why: ``decide`` over them, except that the sample's choice stays where it ran and the
    real calls' choice is not more than ``margin`` faster than it (a few calls apiece are
    noisy too: a near tie is no reason to overrule the sample, whose slowest-round charge
    guards against a strategy that stalls under load)."""
    order = list(seconds)
    chosen, why = decide(seconds, order, margin, ranks, "real calls")
    if (
        chosen == sample
        or sample not in seconds
        or seconds[sample] > seconds[chosen] * (1 + margin)
    ):
        return chosen, why
    return (
        sample,
        f"{sample} (kept within {margin:.0%} of {chosen}; real calls {listed(seconds, order)})",
    )


def contenders(seconds: Mapping[str, float], chosen: str, within: float) -> list[str]:
    """The candidates a real-call trial compares, in the sample's order: each whose
    sample time (its median round, the faster of two: one stalled round, a thread
    descheduled, does not keep a candidate close in the others out) is within ``within``
    of the fastest, the sample's choice always; fewer than two: no trial."""
    best = min(seconds.values())
    near = [c for c, t in seconds.items() if c == chosen or t <= best * (1 + within)]
    return near if len(near) > 1 else []


@dataclasses.dataclass(eq=False, kw_only=True)
class Trial:
    """Real calls of one key, timed per contender until each ran ``calls`` times.

    ``turn`` names the contender the next call runs: the one with the fewest timed
    calls, then the fewest calls, earlier on a tie, so the contenders alternate (a, b, a,
    b) and a phase of load falls on each. The calls of the first ``warmup_s`` seconds,
    all contenders' together, run in turn but are not timed: cores idle before the trial
    (the sample waits until the process's other threads sleep) reach their working speed
    only after a few milliseconds of work. After that, a contender on several threads
    (``ranks`` above 1) runs twice in a row, timed the second time (``lead``): its helper
    threads idle through the others' calls, and the first of the two busies them again,
    as a run of its own calls keeps them once the key has settled. A contender that may
    not run now (ATen's team without free cores) is ``withdraw``-n: the trial goes on
    without it.
    """

    order: list[str]  # the contenders, in the sample's order
    calls: int  # timed real calls per contender
    ranks: Mapping[str, int] | None = None  # as the sample was decided
    warmup_s: float = 0.0
    # contender -> [(bytes, seconds)] of its timed real calls
    timed: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    ran: dict[str, int] = dataclasses.field(default_factory=dict)  # calls, warm-up too
    warm: float = 0.0  # the warm-up calls' seconds so far
    lead: str = ""  # the contender on several threads whose untimed first call just ran

    def __post_init__(self) -> None:
        self.timed = {c: [] for c in self.order}
        self.ran = dict.fromkeys(self.order, 0)

    def turn(self) -> str:
        """The contender the next real call runs."""
        if self.lead in self.timed:
            return self.lead
        return min(self.order, key=lambda c: (len(self.timed[c]), self.ran[c]))

    def record(self, name: str, nbytes: int, seconds: float) -> bool:
        """One real call of contender ``name`` (timed once the warm-up is over); False:
        ignored (another name, no bytes or no time)."""
        if name not in self.timed or seconds <= 0 or nbytes <= 0:
            return False
        self.ran[name] += 1
        threads = 1 if self.ranks is None else self.ranks[name]
        if self.warm < self.warmup_s:
            self.warm += seconds
        elif threads > 1 and name != self.lead:
            self.lead = name  # its first call of a pair: not timed
        else:
            self.timed[name].append((nbytes, seconds))
            self.lead = ""
        return True

    def withdraw(self, name: str) -> None:
        """Go on without ``name`` (not a contender: nothing changes)."""
        if name in self.order:
            self.order.remove(name)
            del self.timed[name], self.ran[name]

    def done(self) -> bool:
        """Every contender ran ``calls`` times, or at most one is left."""
        return len(self.order) < 2 or all(len(v) >= self.calls for v in self.timed.values())

    def seconds(self) -> tuple[dict[str, float], int]:
        """Each timed contender's seconds for the trial's mean call, in ``order``, and that
        call's bytes: the median of its calls' seconds per byte (one call's hiccup, a
        page fault or a preempted thread, must not decide a lasting choice; a contender
        slow on most of its calls still loses)."""
        got = {c: v for c, v in self.timed.items() if v}
        calls = [x for v in got.values() for x in v]
        mean = sum(n for n, _ in calls) // max(len(calls), 1)
        per = {c: statistics.median(t / n for n, t in v) * mean for c, v in got.items()}
        return per, mean


@dataclasses.dataclass(eq=False)
class Trials:
    """The keys under a real-call trial, and what each thread's real calls may record.

    The call that measured a key's sample gets no turn (``sampled``). A timed call counts
    only for the turn the same thread was given (``turn``: that key and contender), and
    only if the thread recorded no other trial's call since: a trial's turn nested inside
    it (a stacked backup's slices step, itself confirmed) made its time another's too. No
    turn is given and nothing is recorded while the thread measures a sample
    (``measuring``): a trial runs on real calls only, and a sample that ran a trial's
    turns would time them as well. Not locked: the calibrator calls it under its lock.
    """

    open: dict[str, Trial] = dataclasses.field(default_factory=dict)
    recorded: int = 0  # calls recorded, every key and thread
    _local: threading.local = dataclasses.field(default_factory=threading.local)

    def _state(self) -> tuple[dict[str, tuple[int, str]], int, int]:
        """This thread's turns out (key -> its count of records then, the contender),
        records, depth (its ``sampled`` keys are made here too)."""
        local = self._local
        if not hasattr(local, "marks"):
            local.marks, local.records, local.depth, local.sampled = {}, 0, 0, set()
        return local.marks, local.records, local.depth

    def sampled(self, key: str) -> None:
        """This thread just measured ``key``'s sample, on the real call it is making: that
        call gets no turn (its next ``turn(key)`` is None: it runs the sample's choice,
        untimed). The sample copied that call's own bytes and left them in the caches, so
        a contender timed there would run cache-hot (BENCHMARKS.md)."""
        self._state()
        self._local.sampled.add(key)

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """While this thread measures a sample (no turn is given inside)."""
        self._state()
        self._local.depth += 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def turn(self, key: str) -> str | None:
        """``key``'s turn for this thread's next real call (None: no trial, measuring, or
        the call that measured the sample)."""
        trial = self.open.get(key)
        marks, records, depth = self._state()
        sampled: set[str] = self._local.sampled
        if key in sampled and not depth:
            sampled.discard(key)
            return None
        if trial is None or depth:
            return None
        name = trial.turn()
        marks[key] = (records, name)
        return name

    def record(self, key: str, name: str, nbytes: int, seconds: float) -> Trial | None:
        """A timed real call of ``key``'s turn ``name``; the trial, removed, once done."""
        trial = self.open.get(key)
        if trial is None:
            return None
        marks, records, depth = self._state()
        mark = marks.pop(key, None)
        if not depth and mark == (records, name) and trial.record(name, nbytes, seconds):
            self._local.records = records + 1
            self.recorded += 1
        return self._close(key, trial)

    def withdraw(self, key: str, name: str, sample: str | None) -> Trial | None:
        """``key``'s trial goes on without ``name`` (and this thread's turn of it is void);
        without ``sample``, the sample's choice, it ends: that choice stands (a passing
        state, e.g. busy cores, must not make the others the lasting choice). The trial,
        removed, once done."""
        trial = self.open.get(key)
        if trial is None:
            return None
        self._state()[0].pop(key, None)
        if name == sample:
            trial.order.clear()
            trial.timed.clear()
        else:
            trial.withdraw(name)
        return self._close(key, trial)

    def _close(self, key: str, trial: Trial) -> Trial | None:
        if not trial.done():
            return None
        del self.open[key]
        return trial
