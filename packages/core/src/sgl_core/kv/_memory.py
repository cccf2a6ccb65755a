"""Host memory facts used to size pools before allocating them."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys

import torch

__all__ = [
    "HOST_PAGE_BYTES",
    "available_host_bytes",
    "cpu_zeros",
    "page_aligned_zeros",
    "should_pin",
]

_log = logging.getLogger("sgl_core")

#: Alignment of host pool buffers: the OS page (and the O_DIRECT block) size.
HOST_PAGE_BYTES = 4096
_warned_unpinned = False
#: Buffers of at least this many bytes ask for transparent huge pages (2 MiB x86/arm64).
HUGE_PAGE_MIN_BYTES = 4 << 20
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux


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
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8, pin_memory=pin_memory)
    if not pin_memory:  # pinned pages belong to the driver's allocation
        advise_huge_pages(raw)
    raw.zero_()
    offset = -raw.data_ptr() % alignment
    return raw[offset : offset + nbytes].view(dtype).view(shape)


def cpu_zeros(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """``torch.zeros``, with huge pages asked for first where ``device`` is the CPU."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = torch.empty(shape, dtype=dtype)
    advise_huge_pages(raw)
    return raw.zero_()


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask Linux to back an untouched CPU tensor with transparent huge pages: whether it
    was asked (``SGLCORE_HUGE_PAGES=0`` never asks; smaller than
    ``HUGE_PAGE_MIN_BYTES``, not Linux, or a refusal: False).

    A pool's loads and backups touch pieces scattered over gigabytes; with 4 KiB pages
    nearly every piece costs a TLB miss (BENCHMARKS.md, "Huge pages and cold calibration"). Advice
    only: the bytes are the same whatever the kernel does, and a kernel in THP mode
    ``never`` keeps 4 KiB pages. It must come before the first touch (the zeroing),
    or pages already mapped stay small until ``khugepaged`` merges them.
    """
    nbytes = t.numel() * t.element_size()
    if os.environ.get("SGLCORE_HUGE_PAGES") == "0" or nbytes < HUGE_PAGE_MIN_BYTES:
        return False
    if not sys.platform.startswith("linux"):
        return False
    start = -(-t.data_ptr() // HOST_PAGE_BYTES) * HOST_PAGE_BYTES  # madvise: page-aligned
    end = (t.data_ptr() + nbytes) // HOST_PAGE_BYTES * HOST_PAGE_BYTES
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return bool(madvise(start, end - start, _MADV_HUGEPAGE) == 0)
