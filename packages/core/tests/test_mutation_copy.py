"""Run merging and the threaded copy paths, moved bit-exact (issue #18).

The threaded paths start at ``_THREADED_MIN_BYTES`` (a few MiB) per call,
more than any other test moves; these tests move that much (a few ms). The
thread pool is wrapped to count what it is handed, and ``_workers`` is raised
too so the split of a machine with more cores is covered.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sgl_core.transfer.copy import _copy
from sgl_core.transfer.copy._copy import copy_blocks, memmove_blocks
from sgl_core.transfer.copy._pieces import IndexRuns, merge_runs


def i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def runs(src: torch.Tensor, dst: torch.Tensor, unit: int = 1) -> list[tuple[int, int, int]]:
    return list(merge_runs(src, dst, unit))


def test_merge_runs_edges() -> None:
    assert runs(i64(), i64()) == [] and len(merge_runs(i64(), i64())) == 0
    assert runs(i64(7), i64(2)) == [(7, 2, 1)]
    assert runs(i64(8), i64(4), unit=4) == [(8, 4, 4)]
    assert runs(i64(0, 1, 2), i64(5, 6, 7)) == [(0, 5, 3)]
    assert runs(i64(0, 1, 2), i64(5, 6, 8)) == [(0, 5, 2), (2, 8, 1)]  # dst breaks
    assert runs(i64(0, 2, 3), i64(5, 6, 7)) == [(0, 5, 1), (2, 6, 2)]  # src breaks
    assert runs(i64(3, 2, 1), i64(1, 2, 3)) == [(3, 1, 1), (2, 2, 1), (1, 3, 1)]
    assert runs(i64(4, 5, 9, 10, 11, 0), i64(0, 1, 2, 3, 4, 9)) == [
        (4, 0, 2),
        (9, 2, 3),
        (0, 9, 1),
    ]
    # page starts merged by whole pages, lengths in tokens
    assert runs(i64(0, 4, 12), i64(8, 12, 16), unit=4) == [(0, 8, 8), (12, 16, 4)]
    assert runs(i64(0, 1), i64(0, 1), unit=4) == [(0, 0, 4), (1, 1, 4)]
    assert runs(i64(2, 3).int(), i64(6, 7).int()) == [(2, 6, 2)]
    assert list(merge_runs(i64(1, 2, 4), i64(1, 2, 3))) == [(1, 1, 2), (4, 3, 1)]  # unit 1
    result = merge_runs(i64(1, 2, 6), i64(1, 2, 3))
    assert isinstance(result.src_starts[0], int) and isinstance(result.lengths[0], int)


def test_index_runs_iterates_in_order() -> None:
    r = IndexRuns([1, 5], [2, 9], [3, 4])
    assert len(r) == 2 and list(r) == [(1, 2, 3), (5, 9, 4)]
    assert len(IndexRuns([], [], [])) == 0 and list(IndexRuns([], [], [])) == []
    with pytest.raises(ValueError):
        list(IndexRuns([1], [2, 3], [4]))


class CountingPool:
    """The copy thread pool, counting the work handed to it."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.submitted = 0

    def submit(self, fn: Callable[..., None], *args: object) -> object:
        self.submitted += 1
        return self.pool.submit(fn, *args)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> CountingPool:
    counting = CountingPool(_copy._pool())
    monkeypatch.setattr(_copy, "_pool", lambda: counting)
    return counting


MIN = _copy._THREADED_MIN_BYTES


def blocks(count: int, size: int) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """A source with distinct bytes, a zeroed destination, and block addresses (reversed)."""
    src = torch.randint(1, 255, (count * size,), dtype=torch.uint8, generator=gen(size))
    dst = torch.zeros(count * size + 16, dtype=torch.uint8)
    src_ptrs = [src.data_ptr() + i * size for i in range(count)]
    dst_ptrs = [dst.data_ptr() + 8 + (count - 1 - i) * size for i in range(count)]
    return src, dst, src_ptrs, dst_ptrs


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def expect_reversed(src: torch.Tensor, dst: torch.Tensor, count: int, size: int) -> None:
    assert not dst[:8].any() and not dst[8 + count * size :].any()
    got = dst[8 : 8 + count * size].view(count, size)
    assert torch.equal(got, src.view(count, size).flip(0))


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("count", [2, 3, 7, 16])
def test_threaded_memmove_moves_every_block_once(
    pool: CountingPool, monkeypatch: pytest.MonkeyPatch, workers: int, count: int
) -> None:
    monkeypatch.setattr(_copy, "_workers", workers)
    size = -(-MIN // count)  # the blocks add up to the threshold (or just above)
    src, dst, src_ptrs, dst_ptrs = blocks(count, size)
    memmove_blocks(dst_ptrs, src_ptrs, [size] * count)
    expect_reversed(src, dst, count, size)
    # the caller's thread takes the first part; no thread gets an empty one
    assert pool.submitted == min(workers, count - 1)


def test_memmove_stays_serial_below_the_threshold(pool: CountingPool) -> None:
    size = MIN // 4
    src, dst, src_ptrs, dst_ptrs = blocks(4, size)
    memmove_blocks(dst_ptrs, src_ptrs, [size] * 3 + [size - 1])  # one byte short
    assert torch.equal(
        dst[8 + size : 8 + 4 * size], src[: 3 * size].view(3, size).flip(0).flatten()
    )
    assert torch.equal(dst[8 : 7 + size], src[3 * size : 4 * size - 1])
    assert not dst[7 + size]
    assert pool.submitted == 0
    src, dst, src_ptrs, dst_ptrs = blocks(4, size)  # exactly the threshold: threaded
    memmove_blocks(dst_ptrs, src_ptrs, [size] * 4)
    expect_reversed(src, dst, 4, size)
    assert pool.submitted == _copy._workers
    src, dst, src_ptrs, dst_ptrs = blocks(1, 2 * MIN)  # one block is never split
    memmove_blocks(dst_ptrs, src_ptrs, [2 * MIN])
    expect_reversed(src, dst, 1, 2 * MIN)
    assert pool.submitted == _copy._workers
    memmove_blocks([], [], [])


def test_memmove_blocks_of_unequal_sizes(pool: CountingPool) -> None:
    sizes = [10, MIN // 2, 1, 89, MIN // 2]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    src = torch.randint(1, 255, (sum(sizes),), dtype=torch.uint8, generator=gen(1))
    dst = torch.zeros(sum(sizes), dtype=torch.uint8)
    memmove_blocks(
        [dst.data_ptr() + o for o in offsets], [src.data_ptr() + o for o in offsets], sizes
    )
    assert torch.equal(dst, src) and pool.submitted == _copy._workers


@pytest.mark.parametrize("workers", [1, 3])
def test_threaded_copy_blocks_moves_every_block_once(
    pool: CountingPool, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    monkeypatch.setattr(_copy, "_workers", workers)
    # blocks under ATen's own parallel grain, adding up to the threshold
    row = _copy._ATEN_GRAIN // 2
    n = -(-MIN // (row * 2)) + 1  # one more than needed: an odd split
    src = torch.randint(-(2**15), 2**15 - 1, (n, row), dtype=torch.int16, generator=gen(2))
    dst = torch.zeros(n, row, dtype=torch.int16)
    order = torch.randperm(n, generator=gen(3)).tolist()
    copy_blocks([dst[i] for i in order], [src[i] for i in range(n)])
    assert pool.submitted == workers
    for k, i in enumerate(order):
        assert torch.equal(dst[i], src[k])
    copy_blocks([dst[0][:8]], [src[0][:8]])  # small: one thread
    assert pool.submitted == workers
