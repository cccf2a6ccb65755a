"""The (dst, src, len) tables the streaming copy (``_stream``) reads: of address lists,
of numpy slice runs (``slice_ops``) and of row gathers (``rows_ops``, ``rows_table``), and
the checks of where it may copy (``_byte_copyable``, ``_blocks_overlap``). Tables hold raw
CPU addresses and are unchecked: their callers check ranges before building one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from sgl_core.transfer.copy._pieces import index_array, numpy_rows

__all__ = [
    "STREAM_MIN_PIECE_BYTES",
    "ops_table",
    "piece_bytes",
    "rows_ops",
    "rows_table",
    "slice_ops",
]


def ops_table(dst: Any, src: Any, sizes: Any) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The (n, 3) uint64 table of (dst, src, len) triples ``gather`` reads (C order)."""
    table = np.empty((len(sizes), 3), dtype=np.uint64)
    for col, seq in enumerate((dst, src, sizes)):
        table[:, col] = seq
    return table


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


def _units_table(
    dst: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    d_units: np.ndarray[Any, Any],
    s_units: np.ndarray[Any, Any],
    by_source: bool,
) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """``dst[d_units[i]] = src[s_units[i]]`` for every i as the streaming copy's table: each
    unit cut into the pieces contiguous on both sides (the greatest common divisor of the
    two sides' blocks), in item order, or ``by_source`` in the source's order (``slice_ops``).
    Both sides' units hold the same bytes (``_byte_copyable``); unchecked: the units must
    lie inside both arrays."""
    (d_block, d_offs), (s_block, s_offs) = _unit_blocks(dst), _unit_blocks(src)
    piece = math.gcd(d_block, s_block)
    d_cut, s_cut = (
        (offs[:, None] + np.arange(block // piece, dtype=np.int64) * piece).ravel()
        for block, offs in ((d_block, d_offs), (s_block, s_offs))
    )
    stretches = 1
    if by_source:
        within, order = np.argsort(s_cut), np.argsort(s_units)  # any order of equal keys
        d_cut, s_cut = d_cut[within], s_cut[within]
        d_units, s_units = d_units[order], s_units[order]
        stretches = _stretches(s_cut, piece)
    # (stretch, unit, piece within the stretch); one stretch: unit-major
    table = np.empty((stretches, d_units.size, d_cut.size // stretches, 3), dtype=np.uint64)
    for col, (arr, cut, units) in enumerate(((dst, d_cut, d_units), (src, s_cut, s_units))):
        at = arr.ctypes.data + units * arr.strides[0]  # small operands, summed in place
        np.add(
            at[None, :, None], cut.reshape(stretches, 1, -1), out=table[..., col], casting="unsafe"
        )
    table[..., 2] = piece
    return table.reshape(-1, 3)


def _stretches(cut: np.ndarray[Any, Any], piece: int) -> int:
    """How many contiguous stretches of one length a unit's ascending source piece offsets
    ``cut`` make (a stacked backup's unit: one per layer), or 1 where their lengths
    differ."""
    ends = np.flatnonzero(np.diff(cut) != piece) + 1  # where the next stretch starts
    count = ends.size + 1
    even = cut.size % count == 0 and np.array_equal(ends, np.arange(1, count) * (cut.size // count))
    return count if even else 1


def slice_ops(
    dst: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    runs: Sequence[tuple[int, int, int]],
    by_source: bool = False,
) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """``copy_slices(dst, src, runs)`` as the streaming copy's (dst, src, len) table
    (``_units_table``). ``by_source`` (a backup): the pieces in the source's order, units
    by their source position and a unit's pieces by source offset, and where a unit's
    source is several contiguous stretches of one length (a stacked backup's layers) every
    unit's first stretch, then every unit's second: the reads then sweep the source's
    buffers one at a time, where item order reads a stretch of every layer per unit, more
    concurrent streams than the hardware prefetchers follow (the streaming stores need no
    order; BENCHMARKS.md). Unchecked: the runs must lie inside both arrays
    (``slices_step`` checks their extent)."""
    starts = np.array([(b, a) for a, b, _ in runs], dtype=np.int64).reshape(-1, 2)
    counts = np.array([n for _, _, n in runs], dtype=np.int64)
    spans = _run_spans(dst, src, starts, counts, by_source)
    if spans is not None:
        return spans
    firsts = np.repeat(counts.cumsum() - counts, counts)  # each unit's run's first unit
    within = np.arange(int(counts.sum()), dtype=np.int64) - firsts
    d_units, s_units = (np.repeat(starts[:, col], counts) + within for col in (0, 1))
    return _units_table(dst, src, d_units, s_units, by_source)


def piece_bytes(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], run_units: int) -> int:
    """The contiguous piece a run of ``run_units`` units is copied in (what ``slice_ops``
    cuts): the run's blocks where units continue each other's blocks on both sides
    (``_run_spans``), else the greatest common divisor of the two sides' blocks."""
    (d_block, _), (s_block, _) = _unit_blocks(dst), _unit_blocks(src)
    if _runs_continue(dst, src, d_block, s_block):
        return d_block * run_units
    return math.gcd(d_block, s_block)


def _runs_continue(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], d_block: int, s_block: int
) -> bool:
    """Whether units continue each other's blocks on both sides: axis 0's stride is the
    unit's block, the same on both (a run is then one piece per block)."""
    return d_block == s_block == dst.strides[0] == src.strides[0]


def _run_spans(
    dst: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    starts: np.ndarray[Any, Any],
    counts: np.ndarray[Any, Any],
    by_source: bool,
) -> np.ndarray[Any, np.dtype[np.uint64]] | None:
    """The table of runs whose units continue each other's blocks on both sides (axis 0's
    stride is the unit's block, as for the token rows of a ``layer_first`` pool): one
    piece per (run, block) of ``count`` blocks' bytes, not one per (unit, block), e.g.
    61 pieces of 73 KiB for a 64-token run of 61 layers where ``_units_table`` cuts 3904
    of 1152 bytes; run-major, or ``by_source`` block-major with the runs in source order
    (``slice_ops``). None where a side's units do not continue its blocks."""
    (d_block, d_offs), (s_block, s_offs) = _unit_blocks(dst), _unit_blocks(src)
    if not _runs_continue(dst, src, d_block, s_block):
        return None
    if by_source:
        blocks, runs = np.argsort(s_offs), np.argsort(starts[:, 1])
        d_offs, s_offs, starts, counts = d_offs[blocks], s_offs[blocks], starts[runs], counts[runs]
    table = np.empty((starts.shape[0] * d_offs.size, 3), dtype=np.uint64)
    for col, (arr, offs) in enumerate(((dst, d_offs), (src, s_offs))):
        at = arr.ctypes.data + starts[:, col] * d_block
        addr = (offs[:, None] + at[None, :]) if by_source else (at[:, None] + offs[None, :])
        table[:, col] = addr.ravel().astype(np.uint64)
    sizes = counts * d_block
    table[:, 2] = np.tile(sizes, d_offs.size) if by_source else np.repeat(sizes, d_offs.size)
    return table


def rows_ops(
    dst: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    d_rows: np.ndarray[Any, Any],
    s_rows: np.ndarray[Any, Any],
) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """``dst[d_rows] = src[s_rows]`` (a gather and scatter of rows along axis 0) as the
    streaming copy's table (``_units_table``): one copy, where ``take_rows`` makes two
    through a staging buffer. Unchecked: the rows must lie inside both arrays, and the
    destination rows must be distinct (``gather_step`` checks the range)."""
    if d_rows.shape != s_rows.shape or d_rows.ndim != 1:
        raise ValueError(f"row index arrays of shapes {d_rows.shape} and {s_rows.shape}")
    return _units_table(dst, src, d_rows.astype(np.int64), s_rows.astype(np.int64), False)


def rows_table(
    dst: torch.Tensor, src: torch.Tensor, d_idx: torch.Tensor, s_idx: torch.Tensor
) -> Callable[[slice], np.ndarray[Any, np.dtype[np.uint64]]] | None:
    """``rows_ops`` of two CPU tensors' rows (numpy views by address) and index tensors,
    as a builder of the table of the index pairs in a slice (the indices read by address
    when it runs, ``index_array``);
    None where the streaming copy may not copy these rows (``_byte_copyable``).
    Unchecked, as ``rows_ops``."""
    dst_np, src_np = numpy_rows(dst), numpy_rows(src)
    if not _byte_copyable(dst_np, src_np):
        return None

    def build(rows: slice) -> np.ndarray[Any, np.dtype[np.uint64]]:
        d_rows, s_rows = (index_array(idx[rows]) for idx in (d_idx, s_idx))
        return rows_ops(dst_np, src_np, d_rows, s_rows)

    return build
