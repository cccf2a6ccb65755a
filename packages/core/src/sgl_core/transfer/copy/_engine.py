"""The direct-copy engine shared by every direct mover: :class:`RunSide`, :func:`copy_runs`
and :func:`gather_rows` (docs/design.md, "One direct-copy engine"); each caller picks
between them (and the by-address ``memmove_blocks``) with its ``CopyTuning``.

``copy_runs`` dispatches to the copy itself, so a per-layer load stays
within three of our frames from the public method to the copy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from typing import TypedDict

import torch

from sgl_core.transfer.copy._auto_copy import auto_gather, gather_pieces
from sgl_core.transfer.copy._copy import byte_view, copy_batched, copy_blocks, copy_each
from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES, CopyTuning

__all__ = ["RunOptions", "RunSide", "copy_runs", "gather_rows", "run_options"]


class RunOptions(TypedDict):
    """``copy_runs``'s options a ``CopyTuning`` decides."""

    batched: bool
    threads: int


def run_options(tune: CopyTuning) -> RunOptions:
    """``batched`` and ``threads`` of ``copy_runs`` from ``tune``."""
    return {"batched": tune.batched_cross_device, "threads": tune.copy_threads}


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

    def blocks(self, spans: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
        """``block(start, length)`` of every ``(start, length)``: the same views, built cheaper.

        A run copy of short runs builds one view per run and side, so the
        per-view cost is the copy's overhead (hence one page split and
        transpose per call, and dim-0 slices, the cheapest view torch makes).
        """
        t, dim, unit, page = self.tensor, self.axis, self.unit, self.page
        # Split into pages once: needs unit steps of 1, an axis and spans of whole pages.
        if page and (
            unit != 1 or t.shape[dim] % page or any(a % page or n % page for a, n in spans)
        ):
            return [self.block(start, length) for start, length in spans]
        if page:
            t = t.view(*t.shape[:dim], t.shape[dim] // page, page, *t.shape[dim + 1 :])
            unit = page
        cuts = spans if unit == 1 else [(start // unit, length // unit) for start, length in spans]
        # Slices clamp where narrow raises: keep narrow's bounds check, once per call.
        if cuts and (min(a for a, _ in cuts) < 0 or max(a + n for a, n in cuts) > t.shape[dim]):
            return [self.block(start, length) for start, length in spans]
        if self.transpose:
            t = t.transpose(0, 1)
            dim = 1 - dim if dim < 2 else dim
        if dim == 0:
            return [t[a : a + n] for a, n in cuts]
        narrow = t.narrow
        return [narrow(dim, a, n) for a, n in cuts]


def copy_runs(
    runs: Iterable[tuple[int, int, int]],
    pairs: Sequence[tuple[RunSide, RunSide]],
    *,
    into_first: bool,
    batched: bool,
    runs_outer: bool = False,
    threads: int = 0,
) -> None:
    """One block copy per (pair, run), between the two sides of each pair.

    A run ``(a, b, n)`` cuts ``pairs[i][0]`` at ``a`` and ``pairs[i][1]`` at
    ``b`` (``IndexRuns`` order). ``runs_outer`` issues run-major (each caller
    keeps its own issue order); ``batched`` and ``threads`` are ``CopyTuning``'s.
    """
    spans = list(runs)
    if not spans or not pairs:
        return
    a_spans = [(a, n) for a, _, n in spans]
    b_spans = [(b, n) for _, b, n in spans]
    # Per pair, its blocks in run order; then interleaved for run-major issue.
    a_blocks = [a_side.blocks(a_spans) for a_side, _ in pairs]
    b_blocks = [b_side.blocks(b_spans) for _, b_side in pairs]
    if runs_outer and len(pairs) > 1:
        first = [t for run in zip(*a_blocks, strict=True) for t in run]
        second = [t for run in zip(*b_blocks, strict=True) for t in run]
    else:
        first = [t for blocks in a_blocks for t in blocks]
        second = [t for blocks in b_blocks for t in blocks]
    dst, src = (first, second) if into_first else (second, first)
    if dst[0].device == src[0].device:
        copy_blocks(dst, src, threads=threads)
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
    threads: int = 0,
) -> None:
    """``dst[i].index_copy_(0, dst_idx, src[i].index_select(axis, src_idx))`` for each i.

    Moved as bytes (``byte_view``: fp8 has no index kernels). With
    ``non_blocking`` a copy to the CPU still is not async: the scatter reads it
    next. ``out`` is a reused gather buffer; ``threads`` is ``CopyTuning.copy_threads``.
    """
    if not dst:
        return
    if threads and axis == 0 and dst[0].device.type == "cpu" and src[0].device.type == "cpu":
        d_cpu, s_cpu = dst_idx.to("cpu", torch.int64), src_idx.to("cpu", torch.int64)
        dsts, srcs = [byte_view(d) for d in dst], [byte_view(s) for s in src]
        row = src[0][0].numel() * src[0].element_size() if src[0].dim() else 1
        if threads == AUTO and row * len(src) * d_cpu.numel() >= AUTO_MIN_BYTES:
            whole = functools.partial(
                _gather_whole, dst, src, d_cpu, s_cpu, axis, non_blocking, out
            )
            auto_gather(dsts, srcs, d_cpu, s_cpu, whole)
        else:
            gather_pieces(dsts, srcs, d_cpu, s_cpu, 1 if threads == AUTO else threads, out)
        return
    _gather_whole(dst, src, dst_idx, src_idx, axis, non_blocking, out)


def _gather_whole(
    dst: Sequence[torch.Tensor],
    src: Sequence[torch.Tensor],
    dst_idx: torch.Tensor,
    src_idx: torch.Tensor,
    axis: int,
    non_blocking: bool,
    out: torch.Tensor | None,
) -> None:
    s_idx = src_idx.to(src[0].device, non_blocking=non_blocking)
    d_idx = dst_idx.to(dst[0].device, non_blocking=non_blocking)
    buffer = out
    for d, s in zip(dst, src, strict=True):
        view = byte_view(s)
        if (  # ``buffer`` is exactly this ``index_select``'s result
            buffer is not None
            and (buffer.dtype, buffer.device) == (view.dtype, view.device)
            and tuple(buffer.shape) == (*view.shape[:axis], s_idx.numel(), *view.shape[axis + 1 :])
            and buffer.is_contiguous()
        ):
            rows = torch.index_select(view, axis, s_idx, out=buffer)
        else:
            rows = view.index_select(axis, s_idx)
            # Reuse it for the next pairs: one allocation per call, not per layer (a
            # fresh multi-MB temporary per layer can cost a page fault per 4 KiB).
            if reusable_after(rows.device, d.device, non_blocking=non_blocking):
                buffer = rows
        if axis:
            rows = rows.transpose(0, axis)
        if rows.device != d.device:
            rows = rows.contiguous().to(
                d.device, non_blocking=non_blocking and d.device.type != "cpu"
            )
        byte_view(d).index_copy_(0, d_idx, rows)


def reusable_after(gather: torch.device, dst: torch.device, *, non_blocking: bool) -> bool:
    """Whether a gather buffer may be overwritten once its scatter into ``dst`` was issued.

    Not while an async copy to another (accelerator) device may still read
    it; a copy to the CPU is synchronous, and on one device the next gather
    is ordered after the scatter on the same stream.
    """
    return gather == dst or dst.type == "cpu" or not non_blocking
