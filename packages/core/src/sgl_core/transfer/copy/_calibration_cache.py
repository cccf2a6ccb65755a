"""The copy calibration's optional disk cache: :class:`DiskCache`, one JSON file of
measured choices per host (docs/design.md, "Copy threads, calibrated").
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
from pathlib import Path
from typing import Any

import torch

from sgl_core.transfer.copy._stream import stream_copy_status

__all__ = [
    "CopyChoice",
    "DiskCache",
    "ENV_VAR",
    "FORMAT",
    "host_id",
]


@dataclasses.dataclass(frozen=True)
class CopyChoice:
    """What a calibration chose for one key, what it measured, and why."""

    key: str
    choice: str
    seconds: dict[str, float]  # each candidate's slowest sample round (confirmed: median call)
    nbytes: int  # bytes one run of the sample moves (confirmed: the mean real call's)
    source: str  # "measured", "re-measured", "confirmed" (on real calls) or "disk cache"
    reason: str
    measured_at: float = 0.0  # the calibrator's clock when it was measured or loaded

    @property
    def gbps(self) -> float:
        """The chosen candidate's throughput on the sample (or its real calls), GB/s."""
        return self.nbytes / max(self.seconds[self.choice], 1e-12) / 1e9


# The disk cache: JSON ``{"format": FORMAT, "host": <this machine>, "entries": {key: entry}}``,
# written atomically (a temporary file renamed over it). A file that does not parse, has
# another format, was written on another host or holds a malformed entry is ignored whole
# and overwritten at the next measurement; an unwritable path only loses the cache.
ENV_VAR = "SGLCORE_COPY_CALIBRATION"
# v2: the copy steps also offer the streaming copy (a v1 file never measured it); v3: the
# row-gather (``take``) steps offer it too (a v2 file never measured it there); v4: backups
# by slices offer it, and a slices key's piece is what the streaming table cuts (a v3 key
# could name a page_first and a layer_first backup at once); v5: candidates ranked by
# thread count (a v4 choice kept memmove or ATen's team within 25% of a faster streaming
# copy on as many threads); v6: close samples confirmed on real calls (a v5 choice is a
# sample's alone); v7: a backup's streaming table in source order (a v6 stacked backup
# may keep torch's run copies against the slower item-order table); v8: the streaming copy
# moves 32 bytes a step where the CPU has AVX2, and a later thread-count rank must win by
# 10% (a v7 choice was measured with the 16-byte kernel and kept one thread within 25%);
# v9: a trial's contenders are judged by their median sample round, and its first real
# calls warm the cores up untimed (a v8 sample's choice stood alone where one stalled round
# kept a close candidate out, and a v8 trial timed the team on cores back from idle);
# v10: a trial times a contender on several threads on the second of two calls in a row
# (a v9 trial timed the team's first call after the other contenders')
FORMAT = "sgl-core copy calibration v10"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def host_id() -> dict[str, Any]:
    """What must match for a cached choice to apply: CPU, core count, torch, and the
    streaming copy's kernel (``SGLCORE_STREAM_COPY`` may name another one, or none: the
    choices measured with one say nothing of another)."""
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "stream": stream_copy_status(),
    }


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
    reason = f"{choice} (read from {path}; measured {listed})"
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
