"""Batched copy helpers for the ``direct`` io backend of every backend.

Copies are planned as *runs* (both indices step by +1); each run becomes one
slice copy per layer, issued through ``torch._foreach_copy_`` over a few
threads (CPU memcpy of scattered blocks is bound by one core's bandwidth).
Between two CPU buffers, :func:`memmove_blocks` copies blocks by address with
libc's ``memmove`` (ctypes drops the GIL), cheaper per block than the two
tensor views a ``_foreach_copy_`` block needs (BENCHMARKS.md, "Copy-path
limits").
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from sgl_core.transfer.copy._pieces import split_parts, split_pieces, wide_dtype
from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES

__all__ = [
    "at_shutdown",
    "byte_view",
    "copy_batched",
    "copy_blocks",
    "copy_each",
    "memmove_blocks",
    "shutdown_copy_threads",
    "widen_rows",
]

_executor: ThreadPoolExecutor | None = None
_workers = max(1, min(4, os.cpu_count() or 1) - 1)
_executor_lock = threading.Lock()
# Below this many bytes per call the thread hand-off costs more than it saves.
_THREADED_MIN_BYTES = 4 << 20

# The AUTO copies pick a thread count by measurement (_auto_copy, which sgl_core
# imports first); they register here, so the kit never imports its chooser
# (which calls back into the kit with a count).
_AutoBlocks = Callable[[list[torch.Tensor], list[torch.Tensor]], None]
_AutoMemmove = Callable[[Sequence[int], Sequence[int], Sequence[int]], None]
_auto: dict[str, Callable[..., None]] = {}


def register_auto_copies(blocks: _AutoBlocks, memmove: _AutoMemmove) -> None:
    """Install the measured ``copy_blocks`` / ``memmove_blocks`` that ``AUTO`` calls."""
    _auto["blocks"] = blocks
    _auto["memmove"] = memmove


def _auto_copy(name: str) -> Callable[..., None]:
    if name not in _auto:
        raise RuntimeError("internal error: sgl_core.transfer.copy._auto_copy not imported")
    return _auto[name]


# ATen splits a CPU copy across its own threads above this many elements.
_ATEN_GRAIN = 32768


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``torch.uint8`` when its dtype is a one-byte float (fp8), else ``t``.

    fp8 KV caches are moved as bytes: torch has no index kernels
    (``index_copy_``, ``index_select``) for fp8 dtypes on every device, and
    bytes are what a bit-exact copy moves anyway.
    """
    if t.dtype.is_floating_point and t.element_size() == 1:
        return t.view(torch.uint8)
    return t


def widen_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as the widest integer dtype whose items tile its last (row) dim.

    Same bytes, fewer elements: a one-page block of a bf16 KV row then stays
    under ATen's parallel grain and copies serially, instead of each block
    starting an OpenMP team (which costs more than copying a page).
    """
    wide = wide_dtype(t)
    return byte_view(t) if wide is None else t.view(wide)


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_workers, thread_name_prefix="sgl-copy")
        return _executor


def shutdown_copy_threads() -> None:
    """Stop the copy threads (idle ones exit; the next threaded copy starts new ones), and
    the streaming team's helpers (``at_shutdown``)."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=True)
    for stop in _shutdown_hooks:
        stop()


_shutdown_hooks: list[Callable[[], None]] = []


def at_shutdown(stop: Callable[[], None]) -> None:
    """Have ``shutdown_copy_threads`` call ``stop`` too (threads this module does not own)."""
    _shutdown_hooks.append(stop)


def _after_fork_in_child() -> None:
    # The parent's copy threads do not exist in a forked child, and its lock may be held:
    # forget both, so the child's first threaded copy starts a pool of its own.
    global _executor, _executor_lock
    _executor = None
    _executor_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _spread(threads: int, count: int, part: Callable[[int, int], None]) -> None:
    """``part(a, b)`` over ``[0, count)`` cut into ``threads`` ranges, the first on this thread."""
    ranges = split_parts(count, threads)
    if len(ranges) < 2:
        part(0, count)
        return
    pool = _pool()
    futures: list[Future[None]] = [pool.submit(part, a, b) for a, b in ranges[1:]]
    try:
        part(*ranges[0])
    finally:
        for future in futures:
            future.result()


def _share(threads: int, count: int, part: Callable[[int, int], None], ranges: int) -> None:
    """``part(a, b)`` over ``[0, count)`` cut into ``ranges`` ranges that the calling thread
    and ``threads - 1`` copy threads take one at a time, so a thread that starts late or
    runs slower takes fewer (a stacked backup's two fixed halves ended 3-4 ms apart in a
    ~20 ms call, BENCHMARKS.md); a copy thread that has not started
    when every range is taken is cancelled, not waited for. After an error no new range is
    taken, and every started one ends before it is raised."""
    cut = split_parts(count, max(ranges, threads))
    if threads < 2 or len(cut) < 2:
        part(0, count)
        return
    lock, taken = threading.Lock(), [0]

    def take() -> None:
        while True:
            with lock:
                i = taken[0]
                taken[0] += 1
            if i >= len(cut):
                return
            try:
                part(*cut[i])
            except BaseException:
                with lock:
                    taken[0] = len(cut)
                raise

    futures = [_pool().submit(take) for _ in range(threads - 1)]
    try:
        take()
    finally:
        for future in futures:
            if not future.cancel():
                future.result()


def copy_pieces(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor], threads: int) -> None:
    """``dst[i].copy_(src[i])`` as pieces below ATen's grain (no piece starts an
    OpenMP team), over ``threads`` threads in order, one ``_foreach_copy_`` each."""
    pieces_d, pieces_s = split_pieces(dst, src)
    if not pieces_d:
        return

    def part(a: int, b: int) -> None:
        torch._foreach_copy_(pieces_d[a:b], pieces_s[a:b])

    _spread(threads, len(pieces_d), part)


def copy_blocks(
    dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor], *, threads: int = 0
) -> None:
    """``dst[i].copy_(src[i])`` for all i, batched and (on CPU) spread over threads.

    ``threads`` (``CopyTuning.copy_threads``) 0: blocks big enough for ATen
    to parallelize internally are issued from one thread (ATen's OpenMP team
    splits each); smaller ones are split across a few Python threads instead.
    """
    if not dst:
        return
    dst_list, src_list = list(dst), list(src)
    on_cpu = dst_list[0].device.type == "cpu" and src_list[0].device.type == "cpu"
    total = sum(t.numel() * t.element_size() for t in dst_list)
    if threads == AUTO and on_cpu:
        if total >= AUTO_MIN_BYTES:
            _auto_copy("blocks")(dst_list, src_list)
            return
        threads = 1
    if threads == 1 and on_cpu:
        torch._foreach_copy_(*split_pieces(dst_list, src_list))
        return
    if threads > 0 and on_cpu:
        copy_pieces(dst_list, src_list, threads)
        return
    big_blocks = total // len(dst_list) >= _ATEN_GRAIN * dst_list[0].element_size()
    if not on_cpu or big_blocks or total < _THREADED_MIN_BYTES or len(dst_list) < 2:
        torch._foreach_copy_(dst_list, src_list)
        return

    def part(a: int, b: int) -> None:
        torch._foreach_copy_(dst_list[a:b], src_list[a:b])

    _spread(_workers + 1, len(dst_list), part)


def copy_each(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` one by one, non-blocking where that is safe.

    Between a device and host memory, a strided host side would be staged in a
    pageable temporary that an async copy could outlive, so only pairs whose
    host side is contiguous go non-blocking.
    """
    for d, s in zip(dst, src, strict=True):
        host_side = d if d.device.type == "cpu" else s
        d.copy_(s, non_blocking=host_side.is_contiguous())


def copy_batched(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """Cross-device pairs in one non-blocking ``_foreach_copy_`` (``batched_cross_device``).

    torch loops over the pairs in C++, one async copy each. A strided pair
    would be staged through a pageable temporary an async copy could outlive,
    so such pairs are split into their contiguous pieces first, and any that
    stay strided are copied blocking.
    """
    dst_parts: list[torch.Tensor] = []
    src_parts: list[torch.Tensor] = []
    strided: list[tuple[torch.Tensor, torch.Tensor]] = []
    for d, s in zip(dst, src, strict=True):
        if d.is_contiguous() and s.is_contiguous():
            dst_parts.append(d)
            src_parts.append(s)
            continue
        for dp, sp in zip(d.unbind(0), s.unbind(0), strict=True):
            if dp.is_contiguous() and sp.is_contiguous():
                dst_parts.append(dp)
                src_parts.append(sp)
            else:
                strided.append((dp, sp))
    if dst_parts:
        torch._foreach_copy_(dst_parts, src_parts, non_blocking=True)
    for dp, sp in strided:
        dp.copy_(sp)


def _memmove_all(dst: Sequence[int], src: Sequence[int], sizes: Sequence[int]) -> None:
    move = ctypes.memmove
    for d, s, n in zip(dst, src, sizes, strict=True):
        move(d, s, n)


def memmove_blocks(
    dst: Sequence[int], src: Sequence[int], sizes: Sequence[int], *, threads: int = 0
) -> None:
    """``memmove(dst[i], src[i], sizes[i])`` for all i: raw CPU addresses, in bytes.

    Unchecked: the caller guarantees that every block lies inside live CPU
    tensors it holds for the duration of the call.
    """
    count = len(sizes)
    if threads == AUTO:
        if count >= 2 and sum(sizes) >= AUTO_MIN_BYTES:
            _auto_copy("memmove")(dst, src, sizes)
            return
        threads = 1
    if threads == 0:
        threads = _workers + 1 if count >= 2 and sum(sizes) >= _THREADED_MIN_BYTES else 1
    if threads == 1:
        _memmove_all(dst, src, sizes)
        return

    def part(a: int, b: int) -> None:
        _memmove_all(dst[a:b], src[a:b], sizes[a:b])

    _spread(threads, count, part)
