"""Host memory facts used to size pools before allocating them."""

from __future__ import annotations

import logging
import os

import torch

__all__ = ["available_host_bytes", "should_pin"]

_log = logging.getLogger("sgl_core")
_warned_unpinned = False


def available_host_bytes() -> int | None:
    """Bytes the kernel reports as available (``MemAvailable``), if known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def should_pin(requested: bool | None, device: torch.device) -> bool:
    """Pin host memory only when a device needs it and torch can pin here.

    ``None`` means: pin for CUDA devices. Pinning needs a CUDA-enabled torch;
    where it cannot pin, fall back to pageable memory with one log line.
    """
    global _warned_unpinned
    want = device.type == "cuda" if requested is None else requested
    if not want:
        return False
    if torch.cuda.is_available():
        return True
    if not _warned_unpinned:
        _log.info("torch cannot pin host memory here (no CUDA); using pageable host memory")
        _warned_unpinned = True
    return False
