"""Choose a copy's strategy by measuring the candidates, once per kind of copy.

A :class:`Calibrator` times each candidate strategy of one kind of copy (a
*key*: the operation, the two devices, the block size) on a small sample of
the real copy — a few ms, round-robin, each charged its slowest round — and
keeps the winner for
the process (and, where ``SGLCORE_COPY_CALIBRATION`` names a file, on disk
for the next process: ``sgl_core.transfer.copy._calibration_cache``). Each real copy
reports its own throughput (:meth:`Calibrator.observe`); when it runs far
below the figure the choice was measured at, several times in a row, the
key is measured again on its next use (the machine's load changed).

It is generic: candidates are named callables, the clock is injected (tests
drive it with a fake clock; no timed assertions). The CPU copy threads
(``sgl_core.transfer.copy._auto_copy``) are one user; a CUDA backend can register kernel,
copy-engine and batched copy-engine candidates the same way.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from sgl_core.transfer.copy._calibration_cache import DiskCache, Entry

__all__ = ["Calibrator", "CopyChoice", "copy_calibration", "default_calibrator"]


@dataclasses.dataclass(frozen=True)
class CopyChoice:
    """What a calibration chose for one key, what it measured, and why."""

    key: str
    choice: str
    seconds: dict[str, float]  # each candidate's slowest timed round on the sample
    nbytes: int  # bytes one run of the sample moves
    source: str  # "measured", "re-measured" or "disk cache"
    reason: str
    measured_at: float = 0.0  # the calibrator's clock when it was measured or loaded

    @property
    def gbps(self) -> float:
        """The chosen candidate's throughput on the sample, GB/s."""
        return self.nbytes / max(self.seconds[self.choice], 1e-12) / 1e9


def _decide(seconds: Mapping[str, float], order: Sequence[str], margin: float) -> tuple[str, str]:
    """The first candidate in preference order within ``margin`` of the fastest, and why."""
    best = min(seconds.values())
    chosen = next(c for c in order if seconds[c] <= best * (1 + margin))
    listed = ", ".join(f"{c}: {seconds[c] * 1e3:.3f} ms" for c in order)  # slowest rounds
    fastest = min(order, key=lambda c: seconds[c])
    why = "fastest" if chosen == fastest else f"preferred within {margin:.0%} of {fastest}"
    return chosen, f"{chosen} ({why}; slowest rounds {listed})"


class Calibrator:
    """Measured choices per key; thread-safe (one lock, held while measuring).

    ``rounds`` timed round-robin rounds after one untimed warm-up round, cut
    short once ``budget_s`` is spent (every candidate keeps at least one
    sample); a candidate's time is its slowest timed round. A candidate later
    in ``order`` must beat an earlier one by more than ``margin`` to be
    chosen. A real copy below ``drop`` x the figure (the best real copy since
    the key was measured, at least half the sample's GB/s) is a strike;
    ``strikes`` in a row, at least ``min_interval_s`` after the measurement,
    make the key stale.
    """

    def __init__(
        self,
        *,
        timer: Callable[[], float] = time.perf_counter,
        rounds: int = 3,
        budget_s: float = 0.01,
        margin: float = 0.25,
        drop: float = 0.25,
        strikes: int = 3,
        min_interval_s: float = 5.0,
        cache: DiskCache | None = None,
    ) -> None:
        self.timer = timer
        self.rounds = rounds
        self.budget_s = budget_s
        self.margin = margin
        self.drop = drop
        self.strikes = strikes
        self.min_interval_s = min_interval_s
        self.cache = cache
        self._lock = threading.Lock()
        self._choices: dict[str, CopyChoice] = {}
        self._stale: dict[str, str] = {}  # key -> why it is measured again
        self._strikes: dict[str, int] = {}
        self._seen: dict[str, float] = {}  # key -> best GB/s of a real copy since measured
        self._loaded = False

    def choices(self) -> list[CopyChoice]:
        """Every current choice, by key."""
        with self._lock:
            return [self._choices[k] for k in sorted(self._choices)]

    def forget(self) -> None:
        """Drop every choice (the disk cache file stays)."""
        with self._lock:
            self._choices.clear()
            self._stale.clear()
            self._strikes.clear()
            self._seen.clear()

    def current(self, key: str) -> str | None:
        """The choice for ``key`` if one is known and not stale (nothing is measured)."""
        with self._lock:
            self._load_disk()
            known = self._choices.get(key)
            return None if known is None or key in self._stale else known.choice

    def choose(self, key: str, candidates: Mapping[str, Callable[[], None]], nbytes: int) -> str:
        """The candidate chosen for ``key`` (``candidates``, by preference, measured if new)."""
        with self._lock:
            self._load_disk()
            known = self._choices.get(key)
            if known is not None and key not in self._stale and known.choice in candidates:
                return known.choice
            choice = self._measure(key, candidates, nbytes)
            self._choices[key] = choice
            self._stale.pop(key, None)
            self._strikes.pop(key, None)
            self._seen.pop(key, None)
            if self.cache is not None:
                self.cache.store(key, Entry(choice.choice, choice.seconds, nbytes))
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
            best = max(self._seen.get(key, 0.0), known.gbps / 2)
            if gbps >= best * self.drop:
                self._seen[key] = max(best, gbps)
                self._strikes[key] = 0
                return False
            strikes = self._strikes.get(key, 0) + 1
            self._strikes[key] = strikes
            if strikes < self.strikes or self.timer() - known.measured_at < self.min_interval_s:
                return False
            self._stale[key] = (
                f"observed {gbps:.3g} GB/s < {self.drop} x the best since measured, "
                f"{best:.3g} GB/s, {strikes} times"
            )
            return True

    # ----------------------------------------------------------- internals
    def _measure(
        self, key: str, candidates: Mapping[str, Callable[[], None]], nbytes: int
    ) -> CopyChoice:
        order = list(candidates)
        if len(order) == 1:
            only = order[0]
            return CopyChoice(
                key, only, {only: 1.0}, nbytes, "measured", f"{only} (only candidate)", self.timer()
            )
        samples: dict[str, list[float]] = {c: [] for c in order}
        start = self.timer()
        for round_no in range(self.rounds + 1):
            for name in order:
                t0 = self.timer()
                candidates[name]()
                if round_no:  # round 0 warms up (threads, caches, allocations)
                    samples[name].append(self.timer() - t0)
            if round_no and self.timer() - start > self.budget_s:
                break
        # each candidate is charged its slowest timed round: a strategy that now and then
        # waits for a busy core (an OpenMP team) must not win on one lucky round
        seconds = {c: max(v) for c, v in samples.items()}
        chosen, reason = _decide(seconds, order, self.margin)
        stale = self._stale.get(key)
        source = "re-measured" if stale else "measured"
        if stale:
            reason += f"; re-measured: {stale}"
        return CopyChoice(key, chosen, seconds, nbytes, source, reason, self.timer())

    def _load_disk(self) -> None:
        if self._loaded or self.cache is None:
            self._loaded = True
            return
        self._loaded = True
        now = self.timer()
        for key, entry in self.cache.load().items():
            listed = ", ".join(f"{c}: {t * 1e3:.3f} ms" for c, t in entry.seconds.items())
            reason = f"{entry.choice} (read from {self.cache.path}; slowest rounds {listed})"
            self._choices[key] = CopyChoice(
                key, entry.choice, dict(entry.seconds), entry.nbytes, "disk cache", reason, now
            )


_default: Calibrator | None = None
_default_lock = threading.Lock()


def default_calibrator() -> Calibrator:
    """The process's calibrator (disk cache: the file ``SGLCORE_COPY_CALIBRATION`` names)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Calibrator(cache=DiskCache.from_env())
        return _default


def copy_calibration() -> list[CopyChoice]:
    """What this process's copy calibration chose so far, and why (one entry per key)."""
    return default_calibrator().choices()
