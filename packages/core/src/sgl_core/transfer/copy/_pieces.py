"""Index runs, and CPU copies cut into pieces that ATen copies on the calling thread.

Runs: maximal stretches where source and destination indices both step by one
unit (re-exported by ``sgl_core.backend``). A CPU ``copy_`` (or
``index_select`` / ``index_copy_``) of ``GRAIN`` elements or more starts ATen's
OpenMP team, which waits for every core it uses; a piece below the grain never
does (docs/design.md, "Copy threads, calibrated"). Pieces are views (``split``
along dim 0, then of a row along its own dim 0): they cover every byte of the
block exactly once, in order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "GRAIN",
    "IndexRuns",
    "MASK_SPAN",
    "distinct_count",
    "in_range",
    "index_array",
    "index_chunk",
    "merge_runs",
    "numpy_rows",
    "page_numbers",
    "split_parts",
    "split_pieces",
    "wide_dtype",
]

#: ATen's parallel grain (``at::internal::GRAIN_SIZE``): elements per iteration below
#: which a CPU kernel runs serially on the calling thread.
GRAIN = 32768
_WIDE = ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2))


def wide_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The widest integer dtype, wider than ``t``'s, whose items tile its unit-stride rows."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return None
    row = t.shape[-1] * t.element_size()
    return next((dt for dt, size in _WIDE if size > t.element_size() and row % size == 0), None)


def _widen(d: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides (same shape and dtype) as their ``wide_dtype`` (fewer elements, same bytes)."""
    wide = wide_dtype(d) if s.dim() and s.stride(-1) == 1 else None
    if wide is None:
        return d, s
    try:
        return d.view(wide), s.view(wide)
    except RuntimeError:  # strides not divisible by the wider item
        return d, s


def _cut(
    d: torch.Tensor, s: torch.Tensor, out_d: list[torch.Tensor], out_s: list[torch.Tensor]
) -> None:
    if d.numel() < GRAIN or d.dim() == 0:
        out_d.append(d)
        out_s.append(s)
        return
    if d.shape[0] == 1:
        _cut(d[0], s[0], out_d, out_s)
        return
    per_row = d.numel() // d.shape[0]
    rows = max(1, (GRAIN - 1) // max(per_row, 1))
    if rows > 1 or per_row < GRAIN:
        out_d.extend(torch.split(d, rows))
        out_s.extend(torch.split(s, rows))
        return
    for i in range(d.shape[0]):  # one row is itself above the grain: cut inside it
        _cut(d[i], s[i], out_d, out_s)


def split_pieces(
    dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``dst[i] <- src[i]`` as pairs of pieces, each below ``GRAIN`` elements, same bytes."""
    out_d: list[torch.Tensor] = []
    out_s: list[torch.Tensor] = []
    for d, s in zip(dst, src, strict=True):
        if d.shape != s.shape or d.dtype != s.dtype:
            out_d.append(d)  # a broadcasting or casting copy: left whole (copy_ handles it)
            out_s.append(s)
            continue
        wd, ws = _widen(d, s)
        _cut(wd, ws, out_d, out_s)
    return out_d, out_s


def index_chunk(row_numel: int) -> int:
    """Indices per gather/scatter chunk so one chunk stays below ``GRAIN`` elements."""
    return max(1, (GRAIN - 1) // max(row_numel, 1))


def split_parts(count: int, parts: int) -> list[tuple[int, int]]:
    """``[0, count)`` cut into ``parts`` nearly equal, non-empty ``(start, end)`` ranges."""
    parts = max(1, min(parts, count))
    bounds = [count * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


class IndexRuns:
    """Runs of paired indices: ``src[i:i+n]`` pairs with ``dst[j:j+n]``."""

    __slots__ = ("dst_starts", "lengths", "src_starts")

    def __init__(self, src_starts: list[int], dst_starts: list[int], lengths: list[int]) -> None:
        self.src_starts = src_starts
        self.dst_starts = dst_starts
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return iter(zip(self.src_starts, self.dst_starts, self.lengths, strict=True))


def merge_runs(src: torch.Tensor, dst: torch.Tensor, unit: int = 1) -> IndexRuns:
    """Merge index pairs into maximal runs where both sides step by ``unit``.

    With ``unit = page_size`` and page-start indices, runs are counted in
    tokens of consecutive whole pages.
    """
    n = src.numel()
    if n == 0:
        return IndexRuns([], [], [])
    if n == 1:
        return IndexRuns([int(src[0])], [int(dst[0])], [unit])
    # numpy, not torch: an ATen index of a few thousand items starts an OpenMP team, which
    # waits for a busy core (BENCHMARKS.md, "Validation without an OpenMP team")
    s, d = (index_array(t.to("cpu")) for t in (src, dst))
    starts = np.flatnonzero((np.diff(s) != unit) | (np.diff(d) != unit)) + 1
    starts = np.concatenate(([0], starts))
    lengths = np.diff(starts, append=n) * unit
    return IndexRuns(s[starts].tolist(), d[starts].tolist(), lengths.tolist())


class _Interface:
    """An array interface of a CPU tensor's memory (numpy views it with no copy), holding
    the tensor so that the memory outlives the array."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, t: torch.Tensor, typestr: str, writable: bool) -> None:
        self.tensor = t
        item = t.element_size()
        self.__array_interface__ = {
            "data": (t.data_ptr(), not writable),  # (address, read-only)
            "shape": tuple(t.shape),
            "strides": tuple(st * item for st in t.stride()),
            "typestr": typestr,
            "version": 3,
        }


def numpy_rows(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A writable numpy view of a CPU tensor's items as unsigned integers of their size
    (the widened rows; bit copies, any item type): same memory, by address
    (``Tensor.numpy()`` would make the storage unresizable for good, and the pool
    validates a resized storage instead); the view keeps ``t`` alive."""
    item = t.element_size()
    return np.asarray(_Interface(t, f"<u{item}" if item in (1, 2, 4, 8) else f"|V{item}", True))


_INT_TYPES = {
    torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.int8: "|i1",
    torch.uint8: "|u1",
}  # fmt: skip


def index_array(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A read-only numpy view of a CPU tensor of integers (indices) with their dtype, by
    address as ``numpy_rows`` (we never write an engine's indices; numpy's DLPack import
    would refuse pinned memory)."""
    return np.asarray(_Interface(t, _INT_TYPES[t.dtype], False))


def in_range(values: np.ndarray[Any, Any], limit: int) -> bool:
    """Whether every value of the integer array ``values`` is in ``[0, limit)`` (an empty
    one: yes); the copy kit's own re-check of indices it reads by address."""
    return not values.size or (int(values.min()) >= 0 and int(values.max()) < limit)


def page_numbers(first_tokens: torch.Tensor, page_size: int) -> torch.Tensor:
    """The page of each token of the CPU tensor ``first_tokens`` (the first token of each
    page of a page-aligned transfer), computed with numpy: an ATen op over more than
    ``GRAIN`` indices would start an OpenMP team (BENCHMARKS.md, "Validation without an
    OpenMP team")."""
    return torch.from_numpy(index_array(first_tokens) // page_size)


#: ``distinct_count``'s mask of ``limit`` flags replaces a sort where ``limit`` is at most
#: this many times the value count.
MASK_SPAN = 64


def distinct_count(values: np.ndarray[Any, Any], limit: int | None = None) -> int:
    """The number of distinct values in the non-empty 1-D integer array ``values`` (numpy:
    no OpenMP team). With ``limit`` (every value known to be in ``[0, limit)``) a scatter
    into a mask replaces the sort where the mask is small (``MASK_SPAN``)."""
    if limit is not None and limit <= MASK_SPAN * values.size:
        seen = np.zeros(limit, dtype=np.bool_)
        seen[values] = True
        return int(np.count_nonzero(seen))
    ordered = np.sort(values)
    return 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1]))
