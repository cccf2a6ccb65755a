"""Choose a copy's strategy by measuring the candidates, once per kind of copy: a
:class:`Calibrator` and its :class:`DiskCache` (docs/design.md, "Copy threads,
calibrated": the CPU copy threads and the CUDA copy paths).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from sgl_core.transfer.copy._busy import settle
from sgl_core.transfer.copy._calibration_cache import (
    ENV_VAR,
    FORMAT,
    CopyChoice,
    DiskCache,
    host_id,
)

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


def _decide(
    seconds: Mapping[str, float],
    order: Sequence[str],
    margin: float,
    ranks: Mapping[str, int] | None = None,
) -> tuple[str, str]:
    """The fastest candidate of the first rank whose fastest is within ``margin`` of the
    fastest of all, and why. Without ``ranks`` each candidate is a rank of its own, in
    ``order``; candidates of one rank compete on speed alone (the earlier on a tie)."""
    best = min(seconds.values())
    rank = ranks if ranks is not None else {c: i for i, c in enumerate(order)}
    groups = [[c for c in order if rank[c] == r] for r in sorted({rank[c] for c in order})]
    leaders = (min(group, key=lambda c: seconds[c]) for group in groups)
    chosen = next(c for c in leaders if seconds[c] <= best * (1 + margin))
    listed = ", ".join(f"{c}: {seconds[c] * 1e3:.3f} ms" for c in order)  # slowest rounds
    fastest = min(order, key=lambda c: seconds[c])
    why = "fastest" if chosen == fastest else f"preferred within {margin:.0%} of {fastest}"
    return chosen, f"{chosen} ({why}; slowest rounds {listed})"


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class Calibrator:
    """Measured choices per key; thread-safe (one lock, held while measuring).

    ``rounds`` timed round-robin rounds after one untimed warm-up round, cut
    short once ``budget_s`` is spent (every candidate keeps at least one
    sample); a candidate's time is its slowest timed round. A candidate of a
    later rank (``choose``'s ``ranks``; without them, later in ``order``) must beat
    the earlier ranks by more than ``margin`` to be chosen; within a rank the fastest
    wins. A real copy below ``drop`` x the figure (the best real copy since
    the key was measured, at least half the sample's GB/s) is a strike;
    ``strikes`` in a row, at least ``min_interval_s`` after the measurement,
    make the key stale.
    """

    timer: Callable[[], float] = time.perf_counter
    rounds: int = 3
    budget_s: float = 0.01
    margin: float = 0.25
    drop: float = 0.25
    strikes: int = 3
    min_interval_s: float = 5.0
    cache: DiskCache | None = None
    #: untimed before every candidate call (``_busy.settle`` for the process's calibrator):
    #: an OpenMP team's workers spin for milliseconds after it returns and would take a core
    #: from the candidate timed next (a 2-thread copy after one ran 35% slower)
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
    _loaded: bool = dataclasses.field(default=False, init=False)

    def choices(self) -> list[CopyChoice]:
        """Every current choice, by key."""
        with self._lock:
            return [self._choices[k] for k in sorted(self._choices)]

    def forget(self) -> None:
        """Drop every choice (the disk cache file stays)."""
        with self._lock:
            self._choices.clear()
            self._stale.clear()
            self._seen.clear()
            self._skipped.clear()

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
    ) -> str:
        """The candidate chosen for ``key`` (``candidates``, by preference, measured if new).

        ``ranks`` (every candidate's, lowest first) groups candidates of equal risk: the
        margin is asked only of a later rank (e.g. more copy threads), while candidates
        of one rank (one thread count) compete on speed alone. Without it, each
        candidate is a rank of its own, in the mapping's order.

        ``cold``, when given, runs untimed before every candidate call and outside the
        budget: what makes a sample that repeats the same bytes see them as the real
        copy does (a per-layer load's step evicts the caches: the real loads go from
        layer to layer, and a cache-hot repeat measured 2x their speed)."""
        with self._lock:
            self._load_disk()
            known = self._choices.get(key)
            if known is not None and key not in self._stale and known.choice in candidates:
                return known.choice
            if ranks is not None and not ranks.keys() >= candidates.keys():
                missing = sorted(candidates.keys() - ranks.keys())
                raise ValueError(f"{key}: no rank for candidate(s) {', '.join(missing)}")
            choice = self._measure(key, candidates, nbytes, cold, ranks)
            self._choices[key] = choice
            self._stale.pop(key, None)
            self._seen.pop(key, None)
            if self.cache is not None:
                self.cache.store(choice)
            return choice.choice

    def observe(self, key: str, nbytes: int, seconds: float) -> bool:
        """Report one real copy of ``key``; True when this made the key stale.

        The figure a copy is compared with is the best real copy of the key
        since it was measured (a sample is small and may sit in cache, so
        its own GB/s would overstate what a whole call reaches).
        """
        with self._lock:
            known = self._choices.get(key)
            if known is None or key in self._stale or seconds <= 0:
                return False
            gbps = nbytes / seconds / 1e9
            # the figure: the best real copy since measured, and at least half the sample's
            # (a choice that is slow from its first real call on is noticed too)
            seen, strikes = self._seen.get(key, (0.0, 0))
            best = max(seen, known.gbps / 2)
            if gbps >= best * self.drop:
                self._seen[key] = (max(best, gbps), 0)
                return False
            strikes += 1
            self._seen[key] = (seen, strikes)
            if strikes < self.strikes or self.timer() - known.measured_at < self.min_interval_s:
                return False
            self._stale[key] = (
                f"observed {gbps:.3g} GB/s < {self.drop} x the best since measured, "
                f"{best:.3g} GB/s, {strikes} times"
            )
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
        ``choose`` was given them), or ``default``
        when there is none (``key`` unknown, or measured with ``without`` alone).
        Counted per key (``skipped``); not a new choice: the next call asks again, and
        the call's time is not reported with ``observe``.
        """
        with self._lock:
            known = self._choices.get(key)
            rest = {} if known is None else known.seconds.copy()
            rest.pop(without, None)
            if among is not None:
                rest = {c: t for c, t in rest.items() if c in among}
            instead = _decide(rest, list(rest), self.margin, ranks)[0] if rest else default
            calls = self._skipped.get(key, (instead, 0))[1] + 1
            self._skipped[key] = (instead, calls)
            return instead

    def skipped(self) -> dict[str, tuple[str, int]]:
        """Per key whose choice was skipped: the candidate run instead (the last one)
        and how many calls ran another candidate than the choice."""
        with self._lock:
            return dict(sorted(self._skipped.items()))

    def _measure(
        self,
        key: str,
        candidates: Mapping[str, Callable[[], None]],
        nbytes: int,
        cold: Callable[[], None] | None,
        ranks: Mapping[str, int] | None,
    ) -> CopyChoice:
        order = list(candidates)
        if len(order) == 1:
            only = order[0]
            return CopyChoice(
                key, only, {only: 1.0}, nbytes, "measured", f"{only} (only candidate)", self.timer()
            )
        samples: dict[str, list[float]] = {c: [] for c in order}
        spent = 0.0  # the candidates' own time (``cold`` is not charged to the budget)
        for round_no in range(self.rounds + 1):
            for name in order:
                if cold is not None:
                    cold()
                if self.settle is not None:
                    self.settle()
                t0 = self.timer()
                candidates[name]()
                took = self.timer() - t0
                spent += took
                if round_no:  # round 0 warms up (threads, caches, allocations)
                    samples[name].append(took)
            if round_no and spent > self.budget_s:
                break
        # each candidate is charged its slowest timed round: a strategy that now and then
        # waits for a busy core (an OpenMP team) must not win on one lucky round
        seconds = {c: max(v) for c, v in samples.items()}
        chosen, reason = _decide(seconds, order, self.margin, ranks)
        stale = self._stale.get(key)
        source = "re-measured" if stale else "measured"
        if stale:
            reason += f"; re-measured: {stale}"
        return CopyChoice(key, chosen, seconds, nbytes, source, reason, self.timer())

    def _load_disk(self) -> None:
        loaded, self._loaded = self._loaded, True
        if loaded or self.cache is None:
            return
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
