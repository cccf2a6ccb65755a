"""Host memory facts used to size pools before allocating them."""

from __future__ import annotations

import logging
import math
import os

import torch

__all__ = ["HOST_PAGE_BYTES", "available_host_bytes", "page_aligned_zeros", "should_pin"]

_log = logging.getLogger("sgl_core")

#: Alignment of host pool buffers: the OS page (and the O_DIRECT block) size.
HOST_PAGE_BYTES = 4096
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


def should_pin(requested: bool | None, device: torch.device | str) -> bool:
    """Pin host memory only when a device needs it and torch can pin here.

    ``None`` means: pin for CUDA devices. Pinning needs a CUDA-enabled torch;
    where it cannot pin, fall back to pageable memory with one log line.
    """
    global _warned_unpinned
    device = torch.device(device)  # engines (SGLang) hand over "cuda:0"-style strings
    want = device.type == "cuda" if requested is None else requested
    if not want:
        return False
    if torch.cuda.is_available():
        return True
    if not _warned_unpinned:
        _log.info("torch cannot pin host memory here (no CUDA); using pageable host memory")
        _warned_unpinned = True
    return False


def page_aligned_zeros(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *,
    pin_memory: bool = False,
    alignment: int = HOST_PAGE_BYTES,
) -> torch.Tensor:
    """A zeroed, contiguous host tensor whose first byte is ``alignment``-aligned.

    O_DIRECT reads and writes need page-aligned addresses; torch's host
    allocators promise only 64 bytes. This over-allocates by ``alignment``
    bytes and returns the aligned view of that storage (the storage stays
    alive through the view).
    """
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.zeros(nbytes + alignment, dtype=torch.uint8, pin_memory=pin_memory)
    offset = -raw.data_ptr() % alignment
    return raw[offset : offset + nbytes].view(dtype).view(shape)
