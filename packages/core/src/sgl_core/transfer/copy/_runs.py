"""Index runs: maximal stretches where source and destination indices both step by one unit.

Re-exported by ``sgl_core.transfer.copy._copy`` (and ``sgl_core.backend``), where every
mover imports them from.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["IndexRuns", "merge_runs"]


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
    src_cpu = src.to("cpu", torch.int64)
    dst_cpu = dst.to("cpu", torch.int64)
    if n == 1:
        return IndexRuns([int(src_cpu[0])], [int(dst_cpu[0])], [unit])
    breaks = (src_cpu[1:] - src_cpu[:-1] != unit) | (dst_cpu[1:] - dst_cpu[:-1] != unit)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(breaks).flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([n], dtype=torch.int64)])
    return IndexRuns(
        src_cpu[starts].tolist(), dst_cpu[starts].tolist(), ((ends - starts) * unit).tolist()
    )
