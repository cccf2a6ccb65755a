"""Cache eviction for cold calibration samples: a scratch buffer twice the biggest CPU
cache, written before each timed sample of a copy smaller than it (docs/design.md,
"Copy threads, calibrated")."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["evict_caches", "scratch_bytes"]

_scratch: np.ndarray[Any, Any] | None = None  # evict_caches's buffer, made at first use


def scratch_bytes(caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Twice the biggest CPU cache sysfs lists (32 MiB where none is bigger), at most 256 MiB."""
    biggest = 32 << 20
    for size in caches.glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = size.read_text(encoding="ascii").strip()
            shift = {"K": 10, "M": 20}.get(text[-1:], 0)
            biggest = max(biggest, int(text.rstrip("KM")) << shift)
    return min(2 * biggest, 256 << 20)


def evict_caches() -> None:
    """Write a scratch buffer of ``scratch_bytes()`` (numpy: no OpenMP team), so the CPU
    caches hold none of the bytes a copy step moves (kept for the process)."""
    global _scratch
    if _scratch is None:
        _scratch = np.zeros(scratch_bytes(), dtype=np.uint8)
    _scratch += 1
