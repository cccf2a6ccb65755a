"""A by-address block copy with non-temporal (streaming) stores, for CPU loads and backups.

``memmove`` reads every destination cache line before it writes it (read-for-ownership)
and leaves both sides in cache; a per-layer load writes bytes that no CPU reads soon, so
on the 2-core dev VM a memmove per block reached 0.4-0.7x of a contiguous copy where the
same blocks with streaming stores reached about 1x (BENCHMARKS.md, issue #27). Python has
no streaming store and this project builds no C extension, so the copy is 156 bytes of
x86-64 machine code (``ASM``; ``CODE`` is what GNU ``as`` makes of it, and a test
re-assembles it where ``as`` is installed) placed in an anonymous mapping that is written
while read+write and then switched to read+execute: never writable and executable at once.

``gather(ops, n)`` copies ``n`` (dst, src, len) triples of uint64: 16-byte unaligned loads
and ``movntdq`` stores in 64-byte steps while the destination is 16-byte aligned and 64 or
more bytes remain, ``rep movsb`` for the rest (and for a destination that is not aligned),
one ``sfence`` at the end, so every store is visible before it returns. Before each
triple it prefetches the first 2 KiB of the source of the triple four ahead: a row of
1152 bytes 70 KiB from the previous one (a ``page_first`` or page-1 copy) starts on a
page the hardware prefetchers have not reached, and its latency is what such a copy
waits for; longer blocks are streams they find themselves (prefetching whole 64 KiB
blocks made those slower, BENCHMARKS.md). Blocks must not overlap (no memmove
semantics): a load's device and host sides are different buffers.

It is a calibrated candidate, never forced: the copy steps (``_steps``) offer it next to
the memmove thread counts, after them in preference order. It is unavailable (and the
steps offer only memmove) off x86-64 Linux, where the mapping or ``PROT_EXEC`` is refused
(SELinux ``execmem``, a seccomp filter, a hardened kernel), and with
``SGLCORE_STREAM_COPY=0``; ``stream_copy_status()`` says which.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "ASM",
    "CODE",
    "ENV_VAR",
    "stream_copy",
    "stream_copy_status",
    "stream_each",
]

#: ``0``/``off``/``false``/``no``: never offer the streaming copy (anything else: offer it)
ENV_VAR = "SGLCORE_STREAM_COPY"

ASM = """\
    .intel_syntax noprefix
    .globl gather
gather:
    mov r11, rdi
    mov rdx, rsi
    test rdx, rdx
    jz 9f
1:
    cmp rdx, 4
    jbe 4f
    mov r8, [r11+104]
    mov r9, [r11+112]
    cmp r9, 2048
    jbe 5f
    mov r9d, 2048
5:
    prefetcht0 [r8]
    add r8, 64
    sub r9, 64
    ja 5b
4:
    mov rdi, [r11]
    mov rsi, [r11+8]
    mov rcx, [r11+16]
    add r11, 24
    test dil, 15
    jnz 3f
    cmp rcx, 64
    jb 3f
2:
    movdqu xmm0, [rsi]
    movdqu xmm1, [rsi+16]
    movdqu xmm2, [rsi+32]
    movdqu xmm3, [rsi+48]
    movntdq [rdi], xmm0
    movntdq [rdi+16], xmm1
    movntdq [rdi+32], xmm2
    movntdq [rdi+48], xmm3
    add rsi, 64
    add rdi, 64
    sub rcx, 64
    cmp rcx, 64
    jae 2b
3:
    rep movsb
    dec rdx
    jnz 1b
9:
    sfence
    ret
"""
# Only caller-saved registers (rdi rsi rdx rcx r8 r9 r11 xmm0-3); the SysV ABI clears the
# direction flag at every call, so ``rep movsb`` runs forward. Entry i+4's source is
# at [r11+104] and its length at [r11+112] (24-byte entries); a prefetch never faults.
CODE = bytes.fromhex(
    "4989fb4889f24885d20f84890000004883fa0476254d8b43684d8b4b704981f9000800007606"
    "41b900080000410f18084983c0404983e94077f2498b3b498b7308498b4b104983c31840f6c7"
    "0f753e4883f9407238f30f6f06f30f6f4e10f30f6f5620f30f6f5e30660fe707660fe74f1066"
    "0fe75720660fe75f304883c6404883c7404883e9404883f94073c8f3a448ffca0f8577ffffff"
    "0faef8c3"
)
_PAGE = 4096
_PROT_RW, _PROT_RX = 0x1 | 0x2, 0x1 | 0x4
_MAP_PRIVATE_ANON = 0x02 | 0x20  # Linux values
_OFF = ("0", "off", "false", "no")

#: ``gather(ops address, n)``: the loaded code (ctypes drops the GIL for the call)
Gather = Callable[[int, int], None]

_lock = threading.Lock()
_loaded: tuple[Gather | None, str] | None = None  # (the function or None, why)


def _map_code(libc: Any) -> Gather | str:
    """``CODE`` in a fresh page via ``libc``'s mmap/mprotect: the function, or why not.
    The page is never unmapped (one per process; the function is kept for good)."""
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mprotect.restype = ctypes.c_int
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = libc.mmap(None, _PAGE, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
    if page is None or page == ctypes.c_void_p(-1).value:
        return f"mmap of a read+write page failed (errno {ctypes.get_errno()})"
    ctypes.memmove(page, CODE, len(CODE))
    if libc.mprotect(page, _PAGE, _PROT_RX) != 0:
        return f"mprotect to read+execute refused (errno {ctypes.get_errno()})"
    fn: Gather = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)(page)
    return fn


def _load() -> tuple[Gather | None, str]:
    if os.environ.get(ENV_VAR, "").strip().lower() in _OFF:
        return None, f"off ({ENV_VAR}={os.environ[ENV_VAR]})"
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"unavailable on {sys.platform} {platform.machine()} (x86-64 Linux only)"
    got = _map_code(ctypes.CDLL(None, use_errno=True))
    return (None, f"unavailable: {got}") if isinstance(got, str) else (got, "available")


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
    if ops.dtype != np.uint64 or ops.ndim != 2 or ops.shape[1] != 3 or not ops.flags.c_contiguous:
        got = f"{ops.dtype} {ops.shape}"
        raise ValueError(f"ops must be a C-ordered (n, 3) uint64 table, got {got}")
    fn = stream_copy()
    if fn is None:
        raise RuntimeError(f"the streaming copy is not loaded: {stream_copy_status()}")
    fn(ops.ctypes.data, ops.shape[0])  # n = 0 returns at once
