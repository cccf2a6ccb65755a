"""Per-layer loads (and CPU run-copy backups) as bound copy steps: the primitive and its
arguments, built once per layer. The primitives, and how a step's thread count is fixed
when it is built: docs/design.md, "Loads as bound copy steps" and "Copy threads, calibrated"."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from sgl_core.transfer.copy import _copy, _evict, _pieces
from sgl_core.transfer.copy._auto_copy import _bucket, thread_candidates, thread_ranks
from sgl_core.transfer.copy._calibrate import default_calibrator
from sgl_core.transfer.copy._copy import _memmove_all, _pool
from sgl_core.transfer.copy._pieces import index_array, index_chunk, numpy_rows, split_parts
from sgl_core.transfer.copy._stream import stream_copy, stream_each
from sgl_core.transfer.copy._stream_gather import stream_shared
from sgl_core.transfer.copy._stream_table import (
    _blocks_overlap,
    _byte_copyable,
    ops_table,
    piece_bytes,
    rows_table,
    slice_ops,
)
from sgl_core.transfer.copy._stream_team import team_bounds, team_each
from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES
from sgl_core.transfer.copy._turns import confirm_call

__all__ = [
    "Step",
    "copy_slices",
    "gather_chunks",
    "gather_step",
    "memmove_each",
    "memmove_step",
    "numpy_rows",
    "slices_shape",
    "slices_step",
    "take_rows",
]

#: ``memmove(dst[i], src[i], sizes[i])`` for every i (raw CPU addresses; unchecked).
memmove_each = _memmove_all

_INTERNAL = "internal error: validated runs out of range in the copy step"
#: CPU backup runs (all rows) below this go as numpy slices (measured: 1.1 MB yes, 4.5 MB no)
SLICES_MAX_RUN_BYTES = 2 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """``fn(*parts[i])`` for every i: ``parts[0]`` on the calling thread, the rest on the
    copy threads (each part touches other destination bytes)."""

    fn: Callable[..., None]
    parts: tuple[tuple[Any, ...], ...]

    def start_rest(self) -> list[Future[None]]:
        """Submit ``parts[1:]`` to the copy threads (none, and no pool, for one part)."""
        return [_pool().submit(self.fn, *p) for p in self.parts[1:]]

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
    if chosen in builds and key not in cal.confirming()[0]:
        return builds[chosen]()
    steps = {name: b() for name, b in builds.items()}  # measured built: a load repeats them
    runs = {name: st.run for name, st in steps.items()}
    if chosen not in builds:  # unknown, stale, or a candidate this process does not offer
        # a sample smaller than the caches would repeat cache-hot bytes (a per-layer load)
        cold = _evict.evict_caches if nbytes < _evict.scratch_bytes() else None
        chosen = cal.choose(key, runs, nbytes, cold, thread_ranks(runs), confirm=True)
    trial = Step(confirm_call, ((cal, key, nbytes, runs, chosen, []),))  # a close sample
    return trial if key in cal.confirming()[0] else steps[chosen]


def _split(items: Sequence[Any], threads: int) -> tuple[tuple[Any, ...], ...]:
    """Parallel lists (or arrays) cut into ``threads`` ranges, one argument tuple per range."""
    ranges = split_parts(len(items[0]), threads)
    return tuple(tuple(seq[a:b] for seq in items) for a, b in ranges) or (
        tuple(seq[:0] for seq in items),
    )


def _stream_step(ops: np.ndarray[Any, Any], threads: int) -> Step:
    """A kept table by the streaming copy: this thread alone, or its team (``team_each``)."""
    if threads < 2:
        return Step(stream_each, ((ops,),))
    return Step(team_each, ((ops, team_bounds(ops.shape[0], threads), threads),))


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
        return _stream_step(ops_table(dst, src, sizes), t)

    # loads only: a load's steps are kept per (plan, layer), so the streaming copy's
    # address table is built once; a backup builds its steps per call
    offer = what == "load" and not _blocks_overlap(dst, src, sizes)
    return _resolve(threads, key, total, build, parts, stream if offer else None)


def copy_slices(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], runs: Sequence[tuple[int, int, int]]
) -> None:
    """``dst[b:b+n] = src[a:a+n]`` for every run ``(a, b, n)`` (units of axis 0)."""
    for a, b, n in runs:
        dst[b : b + n] = src[a : a + n]


def slices_shape(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], runs: Sequence[tuple[int, int, int]]
) -> tuple[int, str]:
    """The bytes ``copy_slices(dst, src, runs)`` moves and its shape class, ``"<run>
    runs of <piece> pieces"``, the piece being what the streaming table cuts
    (``piece_bytes``: page_first's 16-token runs of 1152-byte rows 70 KiB apart want
    other copies than page_first_direct's runs of one page)."""
    row = dst[0].nbytes if dst.shape[0] else 0
    units = sum(n for _, _, n in runs)
    total, run = row * units, row * units // max(len(runs), 1)
    piece = piece_bytes(dst, src, units // max(len(runs), 1)) if total else 0
    return total, f"{_bucket(run)} runs of {_bucket(piece)} pieces"


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
    total, shape = slices_shape(dst, src, runs)
    key = f"slices cpu->cpu {shape}, {_bucket(total)} per {what}"

    def build(t: int) -> Step:
        ranges = split_parts(len(runs), t) or [(0, 0)]  # a step has at least one part
        return Step(copy_slices, tuple((dst, src, runs[a:b]) for a, b in ranges))

    def stream(t: int) -> Step:
        if what == "load":  # kept with the load's steps: the table is built once
            return _stream_step(slice_ops(dst, src, runs), t)
        # a backup's step is built per call: its table is part of what it costs (and of
        # what the calibrator measures)
        return Step(_stream_built, ((dst, src, runs, t),))

    offer = _byte_copyable(dst, src)
    return _resolve(threads, key, total, build, 1, stream if offer else None)


def _stream_built(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], runs: list[tuple[int, int, int]], t: int
) -> None:
    """``copy_slices(dst, src, runs)`` by the streaming copy on ``t`` threads taking its
    table's ranges in turn, the table built first."""
    stream_shared(slice_ops(dst, src, runs, by_source=True), t, stream_each)


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
    s_np, d_np = index_array(s_idx), index_array(d_idx).copy()  # a kept step keeps a copy
    # the flat view reaches past ``src`` and numpy wraps negative indices: refuse both here
    for idx, n in ((s_np, src.shape[0]), (d_np, dst.shape[0])):
        if not _pieces.in_range(idx, n):
            raise RuntimeError(_INTERNAL)
    start = src.storage_offset() % row
    rows = (src.untyped_storage().nbytes() // src.element_size() - start) // row
    flat = numpy_rows(src.as_strided((rows, row), (row, 1), start))
    s_rows = s_np * (src.stride(0) // row) + src.storage_offset() // row
    out = numpy_rows(staging[:count].view(count, row))
    val, dst_np = out.reshape(count, *src.shape[1:]), numpy_rows(dst)

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
    the source rows allow it (and, under AUTO, the streaming copy's ``stream*`` candidates:
    one copy per row), else chunks below ATen's grain; ``threads`` 0: one whole
    ``index_select`` and ``index_copy_`` (ATen's threads)."""
    count = int(d_idx.numel())
    if threads == 0:
        return Step(gather_chunks, ((dst, src, (d_idx,), (s_idx,), (staging[:count],)),))
    total = count * (src[0].numel() * src.element_size() if src.dim() else 1)
    shape = f"{_bucket(total // max(count, 1))} rows, {_bucket(total)} per load"  # of the key
    take = _take_parts(dst, src, d_idx, s_idx, staging)
    if take is not None:  # the rows were range-checked: the streaming copy may move them too
        ops = rows_table(dst, src, d_idx, s_idx)
        stream = None if ops is None else (lambda t: _stream_step(ops(slice(None)), t))
        return _resolve(threads, f"take cpu->cpu {shape}", total, take, 1, stream)
    step = index_chunk(src[0].numel() if src.dim() > 1 else 1)
    d_parts, s_parts, buf_parts = (torch.split(t, step) for t in (d_idx, s_idx, staging[:count]))

    def build(t: int) -> Step:
        parts = _split((d_parts, s_parts, buf_parts), t)
        return Step(gather_chunks, tuple((dst, src, *p) for p in parts))

    return _resolve(threads, f"gather cpu->cpu {shape}", total, build, 1)
