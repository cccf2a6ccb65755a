"""A CPU gather/scatter of rows (``gather_rows`` under ``AUTO``, e.g. a page-1 backup) as
the streaming copy: one (dst, src, len) table entry per row and pair, built per call; and
how a stacked backup's table is shared out over the copy threads (``stream_shared``)
(docs/design.md, "The streaming copy").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from sgl_core.transfer.copy import _copy, _pieces, _stream, _stream_table

__all__ = ["GatherStreams", "SHARE_BYTES", "gather_streams", "stream_shared"]

#: ``(run(threads, a, b), full(threads))``: rows ``[a, b)`` of the first pair, every row
#: of every pair, as the streaming copy over ``threads`` threads.
GatherStreams = tuple[Callable[[int, int, int], None], Callable[[int], None]]


def gather_streams(
    dst: Sequence[torch.Tensor],
    src: Sequence[torch.Tensor],
    d_idx: torch.Tensor,
    s_idx: torch.Tensor,
) -> GatherStreams | None:
    """``dst[i][d_idx] = src[i][s_idx]`` (CPU tensors, int64 CPU indices of one length)
    for every i by the streaming copy, or None where it may not do it: not loaded, a pair
    it may not copy (``_byte_copyable``), an index out of range or a destination row
    twice (``index_copy_`` raises on the first; two threads would race on the second)."""
    if _stream.stream_copy() is None or d_idx.shape != s_idx.shape or d_idx.dim() != 1:
        return None
    pairs = [_stream_table.rows_table(d, s, d_idx, s_idx) for d, s in zip(dst, src, strict=True)]
    builds = [b for b in pairs if b is not None]
    if len(builds) < len(pairs):
        return None
    if not _pieces.in_range(_pieces.index_array(d_idx), min(d.shape[0] for d in dst)):
        return None
    if not _pieces.in_range(_pieces.index_array(s_idx), min(s.shape[0] for s in src)):
        return None
    if d_idx.numel() > 1 and _pieces.distinct_count(_pieces.index_array(d_idx)) != d_idx.numel():
        return None

    def spread(ops: np.ndarray[Any, Any], threads: int) -> None:
        # a fixed split: taking ranges (``stream_shared``) measured no faster here
        _copy._spread(threads, ops.shape[0], lambda a, b: _stream.stream_each(ops[a:b]))

    def run(threads: int, a: int, b: int) -> None:
        spread(builds[0](slice(a, b)), threads)

    def full(threads: int) -> None:
        spread(np.concatenate([build(slice(None)) for build in builds]), threads)

    return run, full


#: A shared streaming copy's ranges move about this many bytes each
SHARE_BYTES = 4 << 20


def stream_shared(
    ops: np.ndarray[Any, np.dtype[np.uint64]],
    threads: int,
    copy: Callable[[np.ndarray[Any, np.dtype[np.uint64]]], None],
) -> None:
    """``copy(ops)`` (``_stream.stream_each``, as the caller names it) on ``threads``
    threads that take ranges of the table of about ``SHARE_BYTES`` each in turn
    (``_copy._share``), for a stacked backup's table, built per call
    (``_steps._stream_built``), and for a per-layer load's kept table where the streaming
    team does not take it (``_stream_team.team_each``: another thread leads it, or it
    has no code). A row gather (a page-1 backup) keeps its fixed split (no faster),
    BENCHMARKS.md."""
    ranges = int(ops[:, 2].sum()) // SHARE_BYTES  # an empty table sums to 0
    _copy._share(threads, ops.shape[0], lambda a, b: copy(ops[a:b]), ranges)
