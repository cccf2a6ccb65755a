"""Choose a copy's strategy by measuring the candidates, once per kind of copy: a
:class:`Calibrator` and its :class:`DiskCache` (docs/design.md, "Copy threads,
calibrated": the CPU copy threads and the CUDA copy paths).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["Calibrator", "CopyChoice", "DiskCache", "copy_calibration", "default_calibrator"]


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


# The disk cache: JSON ``{"format": FORMAT, "host": <this machine>, "entries": {key: entry}}``,
# written atomically (a temporary file renamed over it). A file that does not parse, has
# another format, was written on another host or holds a malformed entry is ignored whole
# and overwritten at the next measurement; an unwritable path only loses the cache.
ENV_VAR = "SGLCORE_COPY_CALIBRATION"
FORMAT = "sgl-core copy calibration v1"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def host_id() -> dict[str, Any]:
    """What must match for a cached choice to apply: CPU, core count, torch."""
    return {"cpu": _cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__}


def _entry(key: str, raw: object, path: Path, now: float) -> CopyChoice | None:
    if not isinstance(raw, dict):
        return None
    choice, seconds, nbytes = raw.get("choice"), raw.get("seconds"), raw.get("nbytes")
    if not isinstance(choice, str) or not isinstance(seconds, dict) or choice not in seconds:
        return None
    if not isinstance(nbytes, int) or not all(  # finite positive numbers (a bool is not one)
        isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
        for v in [nbytes, *seconds.values()]
    ):
        return None
    clean = {str(name): float(value) for name, value in seconds.items()}
    listed = ", ".join(f"{c}: {t * 1e3:.3f} ms" for c, t in clean.items())
    reason = f"{choice} (read from {path}; slowest rounds {listed})"
    return CopyChoice(key, choice, clean, nbytes, "disk cache", reason, now)


class DiskCache:
    """One cache file; ``load`` never raises, ``store`` ignores write errors."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._host = host_id()

    @classmethod
    def from_env(cls) -> DiskCache | None:
        path = os.environ.get(ENV_VAR, "").strip()
        return cls(path) if path else None

    def load(self, now: float = 0.0) -> dict[str, CopyChoice]:
        """The choices (loaded at ``now``) of a file in this format from this host; else none."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return {}
        if doc.get("host") != self._host or not isinstance(doc.get("entries"), dict):
            return {}
        entries: dict[str, CopyChoice] = {}
        for key, raw in doc["entries"].items():
            entry = _entry(str(key), raw, self.path, now)
            if entry is None:
                return {}  # a file with a malformed entry is not trusted at all
            entries[str(key)] = entry
        return entries

    def store(self, choice: CopyChoice) -> None:
        """Add or replace ``choice``'s entry (the rest of a valid file is kept)."""
        with self._lock:
            entries = self.load()
            entries[choice.key] = choice
            doc = {
                "format": FORMAT,
                "host": self._host,
                "entries": {
                    k: {"choice": c.choice, "seconds": c.seconds, "nbytes": c.nbytes}
                    for k, c in sorted(entries.items())
                },
            }
            tmp: str | None = None
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f, indent=1)
                os.replace(tmp, self.path)
            except OSError:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)


def _decide(seconds: Mapping[str, float], order: Sequence[str], margin: float) -> tuple[str, str]:
    """The first candidate in preference order within ``margin`` of the fastest, and why."""
    best = min(seconds.values())
    chosen = next(c for c in order if seconds[c] <= best * (1 + margin))
    listed = ", ".join(f"{c}: {seconds[c] * 1e3:.3f} ms" for c in order)  # slowest rounds
    fastest = min(order, key=lambda c: seconds[c])
    why = "fastest" if chosen == fastest else f"preferred within {margin:.0%} of {fastest}"
    return chosen, f"{chosen} ({why}; slowest rounds {listed})"


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
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

    timer: Callable[[], float] = time.perf_counter
    rounds: int = 3
    budget_s: float = 0.01
    margin: float = 0.25
    drop: float = 0.25
    strikes: int = 3
    min_interval_s: float = 5.0
    cache: DiskCache | None = None
    # reentrant: a candidate may itself be an AUTO copy that asks this calibrator (a stacked
    # backup's path choice times the torch run copies, which choose their thread count)
    _lock: threading.RLock = dataclasses.field(default_factory=threading.RLock, init=False)
    _choices: dict[str, CopyChoice] = dataclasses.field(default_factory=dict, init=False)
    # key -> why it is measured again
    _stale: dict[str, str] = dataclasses.field(default_factory=dict, init=False)
    # key -> (best GB/s of a real copy since measured, strikes in a row)
    _seen: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict, init=False)
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
    ) -> str:
        """The candidate chosen for ``key`` (``candidates``, by preference, measured if new).

        ``cold``, when given, runs untimed before every candidate call and outside the
        budget: what makes a sample that repeats the same bytes see them as the real
        copy does (a per-layer load's step evicts the caches: the real loads go from
        layer to layer, and a cache-hot repeat measured 2x their speed)."""
        with self._lock:
            self._load_disk()
            known = self._choices.get(key)
            if known is not None and key not in self._stale and known.choice in candidates:
                return known.choice
            choice = self._measure(key, candidates, nbytes, cold)
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

    def _measure(
        self,
        key: str,
        candidates: Mapping[str, Callable[[], None]],
        nbytes: int,
        cold: Callable[[], None] | None,
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
        chosen, reason = _decide(seconds, order, self.margin)
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
            _default = Calibrator(cache=DiskCache.from_env())
        return _default


def copy_calibration() -> list[CopyChoice]:
    """What this process's copy calibration chose so far, and why (one entry per key)."""
    return default_calibrator().choices()
