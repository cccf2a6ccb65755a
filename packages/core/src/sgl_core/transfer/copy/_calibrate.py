"""Choose a copy's strategy by measuring the candidates, once per kind of copy: a
:class:`Calibrator` and its :class:`DiskCache` (docs/design.md, "Copy threads,
calibrated": the CPU copy threads and the CUDA copy paths).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Collection, Mapping

from sgl_core.transfer.copy import _decide
from sgl_core.transfer.copy._busy import settle
from sgl_core.transfer.copy._calibration_cache import (
    ENV_VAR,
    FORMAT,
    CopyChoice,
    DiskCache,
    host_id,
)
from sgl_core.transfer.copy._decide import Trial, Trials, contenders, decide

__all__ = [
    "Calibrator",
    "CopyChoice",
    "DiskCache",
    "ENV_VAR",
    "FORMAT",
    "copy_calibration",
    "default_calibrator",
    "host_id",
]


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class Calibrator:
    """Measured choices per key; thread-safe (one lock, held while measuring).

    A candidate's time is its slowest of ``rounds`` rounds within ``budget_s``
    (``timed_rounds``). A candidate of a later rank must beat the earlier ranks by more
    than the key's margin (``rank_margin`` with ``choose``'s ``ranks``, the CPU thread
    counts; ``margin`` in preference order, the CUDA paths); within a rank the fastest
    wins. A real copy below ``drop`` x the figure (the best real copy since the key was
    measured, at least half the sample's GB/s) is a strike; ``strikes`` in a row, at
    least ``min_interval_s`` after the measurement, make the key stale.

    A ``choose(..., confirm=True)`` whose sample leaves more than one candidate within
    ``confirm_within`` of the fastest by median rounds (``contenders``) is confirmed on the
    next real calls: their callers run ``turn(key)`` and report it (``observe(..., ran=)``)
    until each ran ``confirm_calls`` times after ``confirm_warmup_s`` of untimed calls (0
    calls: the sample decides); the real calls then overrule the sample only with one
    more than the key's margin faster (``confirmed``)."""

    timer: Callable[[], float] = time.perf_counter
    rounds: int = 3
    budget_s: float = 0.01
    margin: float = 0.25
    rank_margin: float = 0.10
    drop: float = 0.25
    strikes: int = 3
    min_interval_s: float = 5.0
    confirm_within: float = 0.5
    confirm_calls: int = 3
    confirm_warmup_s: float = 0.005  # a trial's first real calls, not timed (``Trial``)
    cache: DiskCache | None = None
    #: untimed before every candidate call (``_busy.settle`` for the process's calibrator):
    #: an OpenMP team's workers spin after it returns and slow the candidate timed next
    settle: Callable[[], None] | None = None
    # reentrant: a candidate may itself be an AUTO copy that asks this calibrator (a stacked
    # backup's path choice times the torch run copies, which choose their thread count)
    _lock: threading.RLock = dataclasses.field(default_factory=threading.RLock, init=False)
    _choices: dict[str, CopyChoice] = dataclasses.field(default_factory=dict, init=False)
    # key -> why it is measured again
    _stale: dict[str, str] = dataclasses.field(default_factory=dict, init=False)
    # key -> (best GB/s of a real copy since measured, strikes in a row)
    _seen: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict, init=False)
    # key -> (the candidate run instead of the choice, calls that ran it): ``skip``
    _skipped: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict, init=False)
    # the keys whose sample's choice is being confirmed on real calls
    _trials: Trials = dataclasses.field(default_factory=Trials, init=False)
    _loaded: bool = dataclasses.field(default=False, init=False)

    def choices(self) -> list[CopyChoice]:
        """Every current choice, by key."""
        with self._lock:
            return [self._choices[k] for k in sorted(self._choices)]

    def forget(self) -> None:
        """Drop every choice (the disk cache file stays)."""
        with self._lock:
            for table in (self._choices, self._stale, self._seen, self._skipped, self._trials.open):
                table.clear()

    def current(self, key: str) -> str | None:
        """The choice for ``key`` if one is known and not stale (nothing is measured)."""
        with self._lock:
            self._load_disk()
            known = self._choices.get(key)
            return None if known is None or key in self._stale else known.choice

    def choose(
        self,
        key: str,
        candidates: Mapping[str, Callable[[], None]],
        nbytes: int,
        cold: Callable[[], None] | None = None,
        ranks: Mapping[str, int] | None = None,
        confirm: bool = False,
    ) -> str:
        """The candidate chosen for ``key`` (``candidates``, by preference, measured if new).

        ``ranks`` (every candidate's, lowest first) groups candidates of equal risk: only
        a later rank (more copy threads) must win, by ``rank_margin``; one rank's compete on
        speed alone. Without them each candidate is a rank of its own, in the mapping's
        order, and a later one must win by ``margin``.

        ``cold``, when given, runs untimed before every candidate call, outside the budget:
        a sample that repeats the same bytes then sees them as the real copy does (a
        per-layer load's step evicts the caches: a cache-hot repeat ran 2x the real loads).

        ``confirm``: the caller runs ``turn(key)`` on its real calls and reports them with
        ``observe(..., ran=)``, so a close sample is confirmed there (the class's doc);
        the choice is written to the disk cache once confirmed."""
        with self._lock:
            self._load_disk()
            known = self._choices.get(key)
            if known is not None and key not in self._stale and known.choice in candidates:
                return known.choice
            if ranks is not None and not ranks.keys() >= candidates.keys():
                missing = sorted(candidates.keys() - ranks.keys())
                raise ValueError(f"{key}: no rank for candidate(s) {', '.join(missing)}")
            with self._trials.measuring():
                choice, medians = self._measure(key, candidates, nbytes, cold, ranks)
            near = contenders(medians, choice.choice, self.confirm_within)
            if confirm and near and self.confirm_calls > 0:
                tried = f"median rounds of the contenders {_decide.listed(medians, near)}"
                choice = dataclasses.replace(choice, reason=f"{choice.reason}; {tried}")
                calls, warm = self.confirm_calls, self.confirm_warmup_s
                self._trials.open[key] = Trial(order=near, calls=calls, ranks=ranks, warmup_s=warm)
                self._trials.sampled(key)  # this call's bytes are cache-hot: no turn
            else:
                self._trials.open.pop(key, None)
                if self.cache is not None:
                    self.cache.store(choice)
            self._choices[key] = choice
            self._stale.pop(key, None)
            self._seen.pop(key, None)
            return choice.choice

    def turn(self, key: str) -> str | None:
        """The candidate this real call of ``key`` runs while its choice is confirmed
        (report it: ``observe(..., ran=)``); None: run the choice (``Trials.turn``)."""
        with self._lock:
            return self._trials.turn(key)

    def withdraw(self, key: str, name: str) -> None:
        """``key``'s real-call trial goes on without ``name`` (it may not run now); without
        the sample's choice it ends, and that choice stands (``Trials.withdraw``)."""
        with self._lock:
            known = self._choices.get(key)
            sample = None if known is None else known.choice
            self._settle(key, self._trials.withdraw(key, name, sample))

    def confirming(self) -> tuple[list[str], int]:
        """The keys confirmed on real calls now, and the real calls all trials recorded."""
        with self._lock:
            return sorted(self._trials.open), self._trials.recorded

    def observe(self, key: str, nbytes: int, seconds: float, ran: str | None = None) -> bool:
        """Report one real copy of ``key``; True when this made the key stale. ``ran``:
        the candidate it ran (a trial's turn; another than the choice is not compared).

        The figure a copy is compared with is the best real copy of the key since it was
        measured (a sample is small and may sit in cache, so its own GB/s would overstate
        a whole call), and at least half the sample's (a choice slow from its first real
        call on is noticed too)."""
        with self._lock:
            if key in self._trials.open:
                self._settle(key, self._trials.record(key, ran or "", nbytes, seconds))
                return False
            known = self._choices.get(key)
            if known is None or key in self._stale or seconds <= 0:
                return False
            if ran is not None and ran != known.choice:
                return False
            gbps = nbytes / seconds / 1e9
            seen, strikes = self._seen.get(key, (0.0, 0))
            best = max(seen, known.gbps / 2)
            if gbps >= best * self.drop:
                self._seen[key] = (max(best, gbps), 0)
                return False
            strikes += 1
            self._seen[key] = (seen, strikes)
            if strikes < self.strikes or self.timer() - known.measured_at < self.min_interval_s:
                return False
            why = f"observed {gbps:.3g} GB/s < {self.drop} x the best since measured"
            self._stale[key] = f"{why}, {best:.3g} GB/s, {strikes} times"
            return True

    def skip(
        self,
        key: str,
        without: str,
        default: str = "1",
        among: Collection[str] | None = None,
        ranks: Mapping[str, int] | None = None,
    ) -> str:
        """The candidate to run for one call of ``key`` when its choice ``without`` can't
        run well now: the one ``choose`` would have picked from the same measurement
        without it (and, given ``among``, from those this call offers; ``ranks`` as
        ``choose`` was given them), or ``default`` when there is none (``key`` unknown, or
        measured with ``without`` alone). Counted per key (``skipped``); not a new choice:
        the next call asks again, and the call's time is not reported with ``observe``."""
        with self._lock:
            known = self._choices.get(key)
            rest = {} if known is None else known.seconds.copy()
            rest.pop(without, None)
            if among is not None:
                rest = {c: t for c, t in rest.items() if c in among}
            instead = decide(rest, list(rest), self._margin(ranks), ranks)[0] if rest else default
            calls = self._skipped.get(key, (instead, 0))[1] + 1
            self._skipped[key] = (instead, calls)
            return instead

    def skipped(self) -> dict[str, tuple[str, int]]:
        """Per key whose choice was skipped: the candidate run instead (the last one)
        and how many calls ran another candidate than the choice."""
        with self._lock:
            return dict(sorted(self._skipped.items()))

    def _margin(self, ranks: Mapping[str, int] | None) -> float:
        """A key's margin: ranked keys (and their real-call confirmation) ``rank_margin``."""
        return self.margin if ranks is None else self.rank_margin

    def _measure(
        self,
        key: str,
        candidates: Mapping[str, Callable[[], None]],
        nbytes: int,
        cold: Callable[[], None] | None,
        ranks: Mapping[str, int] | None,
    ) -> tuple[CopyChoice, dict[str, float]]:  # the choice, and each one's median round
        order = list(candidates)
        if len(order) == 1:
            one = {order[0]: 1.0}
            why = f"{order[0]} (only candidate)"
            return CopyChoice(key, order[0], one, nbytes, "measured", why, self.timer()), one
        untimed = [cold, self.settle]
        rounds = _decide.timed_rounds(candidates, self.rounds, self.budget_s, self.timer, untimed)
        seconds = {c: max(v) for c, v in rounds.items()}
        chosen, reason = decide(seconds, order, self._margin(ranks), ranks)
        stale = self._stale.get(key)
        reason += f"; re-measured: {stale}" if stale else ""
        source = "re-measured" if stale else "measured"
        medians = {c: statistics.median_low(v) for c, v in rounds.items()}  # of 2: the faster
        return CopyChoice(key, chosen, seconds, nbytes, source, reason, self.timer()), medians

    def _settle(self, key: str, trial: Trial | None) -> None:
        """After ``key``'s trial (None: not over), its real calls decide (``confirmed``; the
        sample's choice stays when fewer than two contenders ran); the choice is cached."""
        if trial is None:
            return
        sample = self._choices[key]
        seconds, mean = trial.seconds()
        choice = sample
        if len(seconds) > 1:
            margin = self._margin(trial.ranks)
            chosen, why = _decide.confirmed(seconds, sample.choice, margin, trial.ranks)
            reason = f"{why}; the sample chose {sample.reason}"
            choice = CopyChoice(key, chosen, seconds, mean, "confirmed", reason, self.timer())
        self._choices[key] = choice  # (nothing seen yet: a trial's calls are not compared)
        if self.cache is not None:
            self.cache.store(choice)

    def _load_disk(self) -> None:
        loaded, self._loaded = self._loaded, True
        if not loaded and self.cache is not None:
            self._choices.update(self.cache.load(self.timer()))


_default: Calibrator | None = None
_default_lock = threading.Lock()


def default_calibrator() -> Calibrator:
    """The process's calibrator (disk cache: the file ``SGLCORE_COPY_CALIBRATION`` names)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Calibrator(cache=DiskCache.from_env(), settle=settle)
        return _default


def copy_calibration() -> list[CopyChoice]:
    """What this process's copy calibration chose so far, and why (one entry per key)."""
    return default_calibrator().choices()
