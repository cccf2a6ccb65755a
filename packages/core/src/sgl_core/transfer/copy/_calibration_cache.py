"""The optional on-disk cache of copy calibrations (``SGLCORE_COPY_CALIBRATION``).

Where the environment variable ``SGLCORE_COPY_CALIBRATION`` names a file, the
calibrator reads its choices from it at first use and writes each new
measurement back (atomically: a temporary file renamed over it). The file is
JSON: ``{"format": FORMAT, "host": <this machine>, "entries": {key: entry}}``.
A file that does not parse, has another format, was written on another host
(CPU model, core count, torch version) or holds malformed entries is ignored
(no entry of it is used) and overwritten at the next measurement; an
unwritable path only loses the cache. Choices move with the machine's load,
so a cached one is a start: a copy observed far slower gets measured again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

__all__ = ["DiskCache", "ENV_VAR", "Entry", "FORMAT", "host_id"]

ENV_VAR = "SGLCORE_COPY_CALIBRATION"
FORMAT = "sgl-core copy calibration v1"


@dataclasses.dataclass(frozen=True)
class Entry:
    choice: str
    seconds: dict[str, float]
    nbytes: int


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def host_id() -> dict[str, Any]:
    """What must match for a cached choice to apply: CPU, core count, torch."""
    return {"cpu": _cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__}


def _entry(raw: object) -> Entry | None:
    if not isinstance(raw, dict):
        return None
    choice, seconds, nbytes = raw.get("choice"), raw.get("seconds"), raw.get("nbytes")
    if not isinstance(choice, str) or not isinstance(seconds, dict) or choice not in seconds:
        return None
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        return None
    clean: dict[str, float] = {}
    for name, value in seconds.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            return None
        if value == float("inf"):
            return None
        clean[str(name)] = float(value)
    return Entry(choice, clean, nbytes)


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

    def load(self) -> dict[str, Entry]:
        """The entries of a file written on this host in this format; else none."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return {}
        if doc.get("host") != self._host or not isinstance(doc.get("entries"), dict):
            return {}
        entries: dict[str, Entry] = {}
        for key, raw in doc["entries"].items():
            entry = _entry(raw)
            if entry is None:
                return {}  # a file with a malformed entry is not trusted at all
            entries[str(key)] = entry
        return entries

    def store(self, key: str, entry: Entry) -> None:
        """Add or replace one entry (the rest of a valid file is kept)."""
        with self._lock:
            entries = self.load()
            entries[key] = entry
            doc = {
                "format": FORMAT,
                "host": self._host,
                "entries": {k: dataclasses.asdict(e) for k, e in sorted(entries.items())},
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
