"""A by-address block copy with non-temporal (streaming) stores, for CPU loads and backups.

``memmove`` reads every destination cache line before it writes it (read-for-ownership)
and leaves both sides in cache; a per-layer load writes bytes that no CPU reads soon, so
on the 2-core dev VM a memmove per block reached 0.4-0.7x of a contiguous copy where the
same blocks with streaming stores reached about 1x (BENCHMARKS.md, issue #27). Python has
no streaming store and this project builds no C extension, so the copy is x86-64 machine
code (``_stream_code``: a kernel per instruction set, each with its assembly source)
placed in an anonymous mapping that is written while read+write and then switched to
read+execute: never writable and executable at once.

``gather(ops, n)`` copies ``n`` (dst, src, len) triples of uint64 with non-temporal
stores in 64-byte steps where the destination is aligned for them, ``rep movsb`` for the
rest, one ``sfence`` at the end. Before each triple it prefetches the first 2 KiB of the
source of the triple eight ahead into the level-2 cache: a row of 1152 bytes 70 KiB from
the previous one (a ``page_first`` or page-1 copy) starts on a page the hardware
prefetchers have not reached, and its latency is what such a copy waits for (a
``prefetcht0`` four ahead, into the level-1 cache, gathered such rows slower,
BENCHMARKS.md); longer blocks are streams the hardware prefetchers find themselves
(prefetching whole 64 KiB blocks made those slower).
Blocks must not overlap (no memmove semantics): a load's device and host sides are
different buffers. The kernel is the first of ``KERNELS`` whose CPU flag
``/proc/cpuinfo`` lists (``avx2``, else ``sse2``, which every x86-64 CPU runs), or the one
``SGLCORE_STREAM_COPY`` names.

It is a calibrated candidate, never forced: the copy steps (``_steps``) offer it next to
the memmove thread counts, after them in preference order. It is unavailable (and the
steps offer only memmove) off x86-64 Linux, where the mapping or ``PROT_EXEC`` is refused
(SELinux ``execmem``, a seccomp filter, a hardened kernel), with
``SGLCORE_STREAM_COPY=0``, and where that names a kernel the CPU does not run;
``stream_copy_status()`` says which.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sgl_core.transfer.copy._stream_code import KERNELS, Kernel

__all__ = [
    "CPUINFO",
    "ENV_VAR",
    "check_table",
    "cpu_flags",
    "map_page",
    "pick_kernel",
    "stream_copy",
    "stream_copy_status",
    "stream_each",
]

#: ``0``/``off``/``false``/``no``: never offer the streaming copy; a kernel's name
#: (``avx2``, ``sse2``): that kernel only; anything else: the first kernel the CPU runs
ENV_VAR = "SGLCORE_STREAM_COPY"
#: Linux's list of the CPU's flags: the first ``flags`` line names what Linux enabled
CPUINFO = Path("/proc/cpuinfo")

_PAGE = 4096
_PROT_RW, _PROT_RX = 0x1 | 0x2, 0x1 | 0x4
_MAP_PRIVATE_ANON = 0x02 | 0x20  # Linux values
_OFF = ("0", "off", "false", "no")

#: ``gather(ops address, n)``: the loaded code (ctypes drops the GIL for the call)
Gather = Callable[[int, int], None]

_lock = threading.Lock()
_loaded: tuple[Gather | None, str] | None = None  # (the function or None, why)


def cpu_flags(path: Path = CPUINFO) -> frozenset[str]:
    """The CPU flags of the first ``flags`` line of ``path`` (none where unreadable)."""
    with contextlib.suppress(OSError), path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name.strip() == "flags":
                return frozenset(value.split())
    return frozenset()


def pick_kernel(asked: str, flags: frozenset[str]) -> Kernel | str:
    """The kernel to map for ``asked`` (``SGLCORE_STREAM_COPY``'s value, stripped and
    lowered) on a CPU with ``flags``, or why none."""
    named = [k for k in KERNELS if k.name == asked]
    for kernel in named or KERNELS:
        if kernel.flag is None or kernel.flag in flags:
            return kernel
    return f"{asked} asked for ({ENV_VAR}), and the CPU's flags do not list {named[0].flag}"


def map_page(libc: Any, code: bytes) -> int | str:
    """``code`` in a fresh page via ``libc``'s mmap/mprotect: the page's address, or why
    not. The page is never unmapped (one per process and build; its code is kept for good)."""
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mprotect.restype = ctypes.c_int
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = libc.mmap(None, _PAGE, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
    if page is None or page == ctypes.c_void_p(-1).value:
        return f"mmap of a read+write page failed (errno {ctypes.get_errno()})"
    ctypes.memmove(page, code, len(code))
    if libc.mprotect(page, _PAGE, _PROT_RX) != 0:
        return f"mprotect to read+execute refused (errno {ctypes.get_errno()})"
    return int(page)


def _map_code(libc: Any, code: bytes) -> Gather | str:
    """The gather ``code`` maps to (``map_page``), or why not."""
    page = map_page(libc, code)
    if isinstance(page, str):
        return page
    fn: Gather = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)(page)
    return fn


def _load() -> tuple[Gather | None, str]:
    asked = os.environ.get(ENV_VAR, "").strip().lower()
    if asked in _OFF:
        return None, f"off ({ENV_VAR}={os.environ[ENV_VAR]})"
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"unavailable on {sys.platform} {platform.machine()} (x86-64 Linux only)"
    kernel = pick_kernel(asked, cpu_flags())
    if isinstance(kernel, str):
        return None, f"unavailable: {kernel}"
    got = _map_code(ctypes.CDLL(None, use_errno=True), kernel.code)
    if isinstance(got, str):
        return None, f"unavailable: {got}"
    return got, f"available ({kernel.name})"


def stream_copy() -> Gather | None:
    """The streaming gather, loaded at first use; None where it is unavailable or off
    (the environment is read once per process)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded[0]


def stream_copy_status() -> str:
    """Whether the steps offer the streaming copy, and why not where they do not."""
    stream_copy()
    assert _loaded is not None
    return _loaded[1]


def stream_each(ops: np.ndarray[Any, np.dtype[np.uint64]]) -> None:
    """Copy every (dst, src, len) row of ``ops`` (raw CPU addresses; unchecked, blocks
    must not overlap) with the streaming gather, which must be loaded."""
    check_table(ops)(ops.ctypes.data, ops.shape[0])  # n = 0 returns at once


def check_table(ops: np.ndarray[Any, Any]) -> Gather:
    """The loaded gather, once ``ops`` is a table it may be given: a ValueError for any
    other array, a RuntimeError where the streaming copy is not loaded."""
    if ops.dtype != np.uint64 or ops.ndim != 2 or ops.shape[1] != 3 or not ops.flags.c_contiguous:
        got = f"{ops.dtype} {ops.shape}"
        raise ValueError(f"ops must be a C-ordered (n, 3) uint64 table, got {got}")
    fn = stream_copy()
    if fn is None:
        raise RuntimeError(f"the streaming copy is not loaded: {stream_copy_status()}")
    return fn
