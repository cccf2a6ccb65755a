"""Per-layer loads (and CPU run-copy backups) as bound copy steps: the primitive and its
arguments, built once per layer. The primitives, and how a step's thread count is fixed
when it is built: docs/design.md, "Loads as bound copy steps" and "Copy threads, calibrated".
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sgl_core.transfer.copy import _copy
from sgl_core.transfer.copy._auto_copy import _bucket, thread_candidates
from sgl_core.transfer.copy._calibrate import default_calibrator
from sgl_core.transfer.copy._copy import _memmove_all, _pool
from sgl_core.transfer.copy._pieces import index_chunk, split_parts
from sgl_core.transfer.copy._stream import ops_table, stream_copy, stream_each
from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES

__all__ = [
    "Step",
    "copy_slices",
    "gather_chunks",
    "gather_step",
    "memmove_each",
    "memmove_step",
    "numpy_rows",
    "slices_step",
    "take_rows",
]

#: ``memmove(dst[i], src[i], sizes[i])`` for every i (raw CPU addresses; unchecked).
memmove_each = _memmove_all

_INTERNAL = "internal error: validated runs out of range in the copy step"
#: CPU backup runs (all rows) below this go as numpy slices (measured: 1.1 MB yes, 4.5 MB no)
SLICES_MAX_RUN_BYTES = 2 << 20
_scratch: np.ndarray[Any, Any] | None = None  # evict_caches's buffer, made at first use
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # bit copies: any item type


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """``fn(*parts[i])`` for every i: ``parts[0]`` on the calling thread, the rest on the
    copy threads (each part touches other destination bytes)."""

    fn: Callable[..., None]
    parts: tuple[tuple[Any, ...], ...]

    def start_rest(self) -> list[Future[None]]:
        """Submit ``parts[1:]`` to the copy threads (none for a one-thread step)."""
        if len(self.parts) < 2:
            return []
        pool = _pool()
        return [pool.submit(self.fn, *p) for p in self.parts[1:]]

    def run(self) -> None:
        """Every part (what a mover's load does inline, without this frame)."""
        rest = self.start_rest()
        try:
            self.fn(*self.parts[0])
        finally:
            finish(rest)


def finish(futures: Sequence[Future[None]]) -> None:
    """Wait for every part handed to the copy threads (re-raising the first error)."""
    for future in futures:
        future.result()


def _resolve(
    threads: int,
    key: str,
    nbytes: int,
    build: Callable[[int], Step],
    aten_parts: int,
    stream: Callable[[int], Step] | None = None,
) -> Step:
    """The step with ``threads`` resolved: explicit, 1 for small calls, else measured.
    ``stream``: the same step by thread count with the streaming copy (``_stream``),
    offered as candidates ``stream1``, ``stream<n>`` after the memmove counts where the
    streaming copy is available."""
    if threads == 0:  # no team in these primitives: the old split of big calls
        return build(aten_parts)
    if threads != AUTO:
        return build(threads)
    if nbytes < AUTO_MIN_BYTES:
        return build(1)
    counts = thread_candidates(with_aten=False)
    builds = {str(t): functools.partial(build, t) for t in counts}
    if stream is not None and stream_copy() is not None:
        builds.update({f"stream{t}": functools.partial(stream, t) for t in counts})
    cal = default_calibrator()
    chosen = cal.current(key)
    if chosen in builds:
        return builds[chosen]()
    # unknown, stale, or a candidate this process does not offer: measure the built steps
    # (building one, e.g. the streaming copy's address table, is not what a load repeats)
    steps = {name: b() for name, b in builds.items()}
    # a sample smaller than the caches would repeat cache-hot bytes (a per-layer load)
    cold = evict_caches if nbytes < _scratch_bytes() else None
    chosen = cal.choose(key, {name: st.run for name, st in steps.items()}, nbytes, cold)
    return steps[chosen]


def _scratch_bytes(caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Twice the biggest CPU cache sysfs lists (32 MiB where none is bigger), at most 256 MiB."""
    biggest = 32 << 20
    for size in caches.glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = size.read_text(encoding="ascii").strip()
            shift = {"K": 10, "M": 20}.get(text[-1:], 0)
            biggest = max(biggest, int(text.rstrip("KM")) << shift)
    return min(2 * biggest, 256 << 20)


def evict_caches() -> None:
    """Write a scratch buffer of ``_scratch_bytes()`` (numpy: no OpenMP team), so the CPU
    caches hold none of the bytes a copy step moves (kept for the process)."""
    global _scratch
    if _scratch is None:
        _scratch = np.zeros(_scratch_bytes(), dtype=np.uint8)
    _scratch += 1


def _split(items: Sequence[Any], threads: int) -> tuple[tuple[Any, ...], ...]:
    """Parallel lists (or arrays) cut into ``threads`` ranges, one argument tuple per range."""
    ranges = split_parts(len(items[0]), threads)
    return tuple(tuple(seq[a:b] for seq in items) for a, b in ranges) or (
        tuple(seq[:0] for seq in items),
    )


def memmove_step(
    dst: list[int], src: list[int], sizes: list[int], threads: int, what: str = "load"
) -> Step:
    """``memmove_each(dst, src, sizes)`` as a step (blocks spread over the resolved threads)."""
    total = sum(sizes)
    avg = total // max(len(sizes), 1)
    key = f"memmove cpu->cpu {_bucket(avg)} blocks, {_bucket(total)} per {what}"
    parts = 1 if len(sizes) < 2 or total < _copy._THREADED_MIN_BYTES else _copy._workers + 1

    def build(t: int) -> Step:
        return Step(memmove_each, _split((dst, src, sizes), t))

    def stream(t: int) -> Step:
        ops = ops_table(dst, src, sizes)
        ranges = split_parts(len(sizes), t) or [(0, 0)]
        return Step(stream_each, tuple((ops[a:b],) for a, b in ranges))

    # loads only: a load's steps are kept per (plan, layer), so the streaming copy's
    # address table is built once; a backup builds its steps per call
    offer = what == "load" and not _blocks_overlap(dst, src, sizes)
    return _resolve(threads, key, total, build, parts, stream if offer else None)


def _blocks_overlap(dst: list[int], src: list[int], sizes: list[int]) -> bool:
    """Whether any destination block shares a byte with any source block (memmove allows
    overlap, the streaming copy does not). Exact, not by spans: a load's blocks lie in
    several buffers (components, layers) whose address ranges interleave."""
    n = np.asarray(sizes, dtype=np.int64)
    d0, s0 = np.asarray(dst, dtype=np.int64), np.asarray(src, dtype=np.int64)
    order = np.argsort(d0, kind="stable")
    starts, ends = d0[order], np.maximum.accumulate((d0 + n)[order])
    # per source block: the destination blocks starting before it ends; any of them that
    # ends after it starts meets it (the running maximum of their ends says whether)
    last = np.searchsorted(starts, s0 + n, side="left") - 1
    return bool(((last >= 0) & (ends[np.maximum(last, 0)] > s0) & (n > 0)).any())


def numpy_rows(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A numpy view of a CPU tensor of integer items (the widened rows): same memory, by
    address (``Tensor.numpy()`` would make the storage unresizable for good, and the pool
    validates a resized storage instead); the view keeps ``t`` alive."""
    item = t.element_size()
    span = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) + 1
    raw = (ctypes.c_char * (span * item if t.numel() else 0)).from_address(t.data_ptr())
    raw.keep = t  # type: ignore[attr-defined]
    flat = np.frombuffer(memoryview(raw).cast("B"), dtype=_BITS.get(item, np.dtype(f"V{item}")))
    strides = tuple(st * item for st in t.stride())
    return np.lib.stride_tricks.as_strided(flat, t.shape, strides, writeable=True)


def copy_slices(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], runs: Sequence[tuple[int, int, int]]
) -> None:
    """``dst[b:b+n] = src[a:a+n]`` for every run ``(a, b, n)`` (units of axis 0)."""
    for a, b, n in runs:
        dst[b : b + n] = src[a : a + n]


def slices_step(
    dst: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    runs: list[tuple[int, int, int]],
    extent: tuple[int, int],
    threads: int,
    what: str = "load",
) -> Step:
    """``copy_slices(dst, src, runs)`` as a step. ``extent``: the end of the runs on the
    source and destination axis 0, checked here (a numpy slice would clamp, not raise)."""
    if extent[0] > src.shape[0] or extent[1] > dst.shape[0]:
        raise RuntimeError(_INTERNAL)
    row = dst[0].nbytes if dst.shape[0] else 0
    total = row * sum(n for _, _, n in runs)
    run = total // max(len(runs), 1)
    # one contiguous piece of a run: the run where its rows are adjacent, else one row
    # (page_first's 16-token runs of 1152-byte rows 70 KiB apart want other thread
    # counts than page_first_direct's runs of one 18 KiB page)
    piece = min(run if a.strides[0] == row else row for a in (src, dst)) if total else 0
    shape = f"{_bucket(run)} runs of {_bucket(piece)} pieces"
    key = f"slices cpu->cpu {shape}, {_bucket(total)} per {what}"

    def build(t: int) -> Step:
        ranges = split_parts(len(runs), t) or [(0, 0)]  # a step has at least one part
        return Step(copy_slices, tuple((dst, src, runs[a:b]) for a, b in ranges))

    def stream(t: int) -> Step:
        ops = slice_ops(dst, src, runs)
        ranges = split_parts(ops.shape[0], t) or [(0, 0)]
        return Step(stream_each, tuple((ops[a:b],) for a, b in ranges))

    offer = what == "load" and _byte_copyable(dst, src)
    return _resolve(threads, key, total, build, 1, stream if offer else None)


#: Pieces shorter than this never reach the streaming stores (``rep movsb`` only)
STREAM_MIN_PIECE_BYTES = 64


def _byte_copyable(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> bool:
    """Whether the streaming copy may do ``copy_slices(dst, src, ...)``: the same items
    (numpy slices would convert others), no memory in common (numpy copies overlapping
    slices as if through a buffer, the streaming copy does not) and pieces of at least
    ``STREAM_MIN_PIECE_BYTES`` on both sides."""
    if dst.dtype != src.dtype or dst.shape[1:] != src.shape[1:]:
        return False
    if np.may_share_memory(dst, src):
        return False
    return math.gcd(_unit_blocks(dst)[0], _unit_blocks(src)[0]) >= STREAM_MIN_PIECE_BYTES


def _unit_blocks(a: np.ndarray[Any, Any]) -> tuple[int, np.ndarray[Any, Any]]:
    """One unit ``a[0]`` as contiguous blocks: their size in bytes and their byte offsets
    from the unit's start, in C order (the order of the unit's items)."""
    shape, strides = a.shape[1:], a.strides[1:]
    block, k = a.itemsize, len(shape)
    while k and (shape[k - 1] == 1 or strides[k - 1] == block):
        block, k = block * shape[k - 1], k - 1
    offsets = np.zeros(1, dtype=np.int64)
    for n, stride in zip(shape[:k], strides[:k], strict=True):
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * stride).ravel()
    return block, offsets


def slice_ops(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], runs: Sequence[tuple[int, int, int]]
) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """``copy_slices(dst, src, runs)`` as the streaming copy's (dst, src, len) table: each
    unit of a run cut into the pieces that are contiguous on both sides (the greatest
    common divisor of the two sides' blocks), in item order. Unchecked: the runs must lie
    inside both arrays (``slices_step`` checks their extent)."""
    (d_block, d_offs), (s_block, s_offs) = _unit_blocks(dst), _unit_blocks(src)
    piece = math.gcd(d_block, s_block)
    cut = []
    for block, offs in ((d_block, d_offs), (s_block, s_offs)):
        cut.append((offs[:, None] + np.arange(block // piece, dtype=np.int64) * piece).ravel())
    starts = np.array([(b, a) for a, b, _ in runs], dtype=np.int64).reshape(-1, 2)
    counts = np.array([n for _, _, n in runs], dtype=np.int64)
    firsts = np.repeat(counts.cumsum() - counts, counts)  # each unit's run's first unit
    within = np.arange(int(counts.sum()), dtype=np.int64) - firsts
    table = np.empty((within.size * cut[0].size, 3), dtype=np.uint64)
    for col, (arr, offs) in enumerate(zip((dst, src), cut, strict=True)):
        units = np.repeat(starts[:, col], counts) + within
        addr = arr.ctypes.data + units[:, None] * arr.strides[0] + offs[None, :]
        table[:, col] = addr.ravel().astype(np.uint64)
    table[:, 2] = piece
    return table


def gather_chunks(
    dst: torch.Tensor,
    src: torch.Tensor,
    d_idx: Sequence[torch.Tensor],
    s_idx: Sequence[torch.Tensor],
    bufs: Sequence[torch.Tensor],
) -> None:
    """``dst[d_idx[i]] = src[s_idx[i]]`` along dim 0 through ``bufs[i]``, chunk by chunk."""
    for d, s, buf in zip(d_idx, s_idx, bufs, strict=True):
        torch.index_select(src, 0, s, out=buf)
        dst.index_copy_(0, d, buf)


def take_rows(
    dst: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    d_idx: np.ndarray[Any, Any],
    s_rows: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    val: np.ndarray[Any, Any],
) -> None:
    """``dst[d_idx] = src[s_rows]`` through ``out`` (``val``: the same memory in ``dst``'s
    row shape). ``mode="clip"`` keeps ``take`` unbuffered; the rows were range-checked."""
    src.take(s_rows, axis=0, out=out, mode="clip")
    dst[d_idx] = val


def _take_parts(
    dst: torch.Tensor, src: torch.Tensor, d_idx: torch.Tensor, s_idx: torch.Tensor,
    staging: torch.Tensor,
) -> Callable[[int], Step] | None:  # fmt: skip
    """``take_rows`` steps by thread count, when each source row is one contiguous block and
    rows lie a multiple of its size apart (else None: the chunked torch gather)."""
    count, row = int(d_idx.numel()), src[0].numel() if src.dim() > 1 else 0
    if not row or not src[0].is_contiguous() or src.stride(0) % row:
        return None
    # the flat view reaches past ``src`` and numpy wraps negative indices: refuse both here
    for idx, n in ((s_idx, src.shape[0]), (d_idx, dst.shape[0])):
        if count and not (int(idx.min()) >= 0 and int(idx.max()) < n):
            raise RuntimeError(_INTERNAL)
    start = src.storage_offset() % row
    rows = (src.untyped_storage().nbytes() // src.element_size() - start) // row
    flat = numpy_rows(src.as_strided((rows, row), (row, 1), start))
    s_rows = (s_idx * (src.stride(0) // row) + src.storage_offset() // row).numpy()
    out = numpy_rows(staging[:count].view(count, row))
    val, dst_np, d_np = out.reshape(count, *src.shape[1:]), numpy_rows(dst), d_idx.numpy()

    def build(t: int) -> Step:
        parts = _split((d_np, s_rows, out, val), t)
        return Step(take_rows, tuple((dst_np, flat, *p) for p in parts))

    return build


def gather_step(
    dst: torch.Tensor,
    src: torch.Tensor,
    d_idx: torch.Tensor,
    s_idx: torch.Tensor,
    staging: torch.Tensor,
    threads: int,
) -> Step:
    """A CPU gather/scatter along dim 0 as a step, each thread through its own rows of
    ``staging``: ``take_rows`` (numpy starts no OpenMP team, so a whole call at once) where
    the source rows allow it, else chunks below ATen's grain; ``threads`` 0: one whole
    ``index_select`` and ``index_copy_`` (ATen's threads)."""
    count = int(d_idx.numel())
    if threads == 0:
        return Step(gather_chunks, ((dst, src, (d_idx,), (s_idx,), (staging[:count],)),))
    total = count * (src[0].numel() * src.element_size() if src.dim() else 1)
    shape = f"{_bucket(total // max(count, 1))} rows, {_bucket(total)} per load"  # of the key
    take = _take_parts(dst, src, d_idx, s_idx, staging)
    if take is not None:
        return _resolve(threads, f"take cpu->cpu {shape}", total, take, 1)
    step = index_chunk(src[0].numel() if src.dim() > 1 else 1)
    d_parts, s_parts, buf_parts = (torch.split(t, step) for t in (d_idx, s_idx, staging[:count]))

    def build(t: int) -> Step:
        parts = _split((d_parts, s_parts, buf_parts), t)
        return Step(gather_chunks, tuple((dst, src, *p) for p in parts))

    return _resolve(threads, f"gather cpu->cpu {shape}", total, build, 1)
