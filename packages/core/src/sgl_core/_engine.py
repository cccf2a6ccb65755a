"""The direct-copy engine: run copies and gathers shared by every direct mover.

Every direct copy (``RowDirectMover``, ``sgl_cuda``'s ``*_direct`` functions,
``sgl_ascend``'s kv-split mover) moves index runs between two tensors whose
layouts differ. :class:`RunSide` says, for one side, which axis a run indexes
and how it is cut into a block; :func:`copy_runs` cuts every block and issues
them with one of ``_copy``'s batched copies; :func:`gather_rows` is the
gather/scatter alternative for short runs. The caller picks between them (and
the by-address ``memmove_blocks``) with its ``CopyTuning``.

``copy_runs`` dispatches to the copy itself, rather than through
``copy_pairs``, so a per-layer load stays within four of our frames from the
public method to the copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import torch

from sgl_core._copy import byte_view, copy_batched, copy_blocks, copy_each

__all__ = ["RunSide", "copy_runs", "gather_rows"]


@dataclasses.dataclass(frozen=True, slots=True)
class RunSide:
    """How one side of a copy is cut into the block of a run.

    The block of a run ``(start, length)`` is ``tensor`` narrowed along
    ``axis`` to ``[start // unit, (start + length) // unit)``; with ``page``
    the narrowed axis is then viewed as ``(pages, page)`` (the slice is viewed,
    not the whole tensor, whose rows need not be whole pages); with
    ``transpose`` dims 0 and 1 are swapped, which puts each side's blocks in
    the other side's dim order without moving which dim is outermost in the
    tensor itself (``copy_batched`` splits strided blocks along dim 0).
    """

    tensor: torch.Tensor
    axis: int = 0
    unit: int = 1
    page: int = 0
    transpose: bool = False

    def block(self, start: int, length: int) -> torch.Tensor:
        t = self.tensor.narrow(self.axis, start // self.unit, length // self.unit)
        if self.page:
            shape = (*t.shape[: self.axis], length // self.page, self.page)
            t = t.view(*shape, *t.shape[self.axis + 1 :])
        return t.transpose(0, 1) if self.transpose else t


def copy_runs(
    runs: Iterable[tuple[int, int, int]],
    pairs: Sequence[tuple[RunSide, RunSide]],
    *,
    into_first: bool,
    batched: bool,
    runs_outer: bool = False,
) -> None:
    """One block copy per (pair, run), between the two sides of each pair.

    A run ``(a, b, n)`` cuts ``pairs[i][0]`` at ``a`` and ``pairs[i][1]`` at
    ``b`` (``IndexRuns`` order); ``into_first`` copies second -> first, else
    first -> second. Blocks are issued pair-major, or run-major with
    ``runs_outer`` (each caller keeps its own issue order). On one device the
    blocks go through ``copy_blocks``; across devices one by one
    (``copy_each``) or, with ``batched`` (``CopyTuning.batched_cross_device``),
    in one non-blocking ``copy_batched``.
    """
    first: list[torch.Tensor] = []
    second: list[torch.Tensor] = []
    spans = list(runs)
    if runs_outer:
        cuts = [(p, s) for s in spans for p in pairs]
    else:
        cuts = [(p, s) for p in pairs for s in spans]
    for (a_side, b_side), (a, b, n) in cuts:
        first.append(a_side.block(a, n))
        second.append(b_side.block(b, n))
    if not first:
        return
    dst, src = (first, second) if into_first else (second, first)
    if dst[0].device == src[0].device:
        copy_blocks(dst, src)
    elif batched:
        copy_batched(dst, src)
    else:
        copy_each(dst, src)


def gather_rows(
    dst: Sequence[torch.Tensor],
    src: Sequence[torch.Tensor],
    dst_idx: torch.Tensor,
    src_idx: torch.Tensor,
    *,
    axis: int = 0,
    non_blocking: bool = False,
    out: torch.Tensor | None = None,
) -> None:
    """``dst[i].index_copy_(0, dst_idx, src[i].index_select(axis, src_idx))`` for each i.

    One gather and one scatter per pair, moved as bytes (``byte_view``: fp8
    has no index kernels). A gather along ``axis`` > 0 is moved to dim 0
    (``transpose``) and made contiguous before it crosses devices. With
    ``non_blocking`` the index uploads and a copy *to* an accelerator are
    asynchronous (a copy to the CPU never is: the scatter reads it next).
    ``out``, for a single pair, is a reused gather buffer.
    """
    if not dst:
        return
    s_idx = src_idx.to(src[0].device, non_blocking=non_blocking)
    d_idx = dst_idx.to(dst[0].device, non_blocking=non_blocking)
    for d, s in zip(dst, src, strict=True):
        if out is not None:
            rows = torch.index_select(byte_view(s), axis, s_idx, out=out)
        else:
            rows = byte_view(s).index_select(axis, s_idx)
        if axis:
            rows = rows.transpose(0, axis)
        if rows.device != d.device:
            rows = rows.contiguous().to(
                d.device, non_blocking=non_blocking and d.device.type != "cpu"
            )
        byte_view(d).index_copy_(0, d_idx, rows)
