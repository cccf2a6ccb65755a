"""A backup's streaming table in the source's order (``slice_ops(..., by_source=True)``):
the same (dst, src, len) pieces as item order, bit-exact, arranged so the reads sweep the
stacked device buffer one layer at a time (docs/design.md, "The streaming copy")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sgl_core.transfer.copy import _stream, _stream_table
from sgl_core.transfer.copy._steps import copy_slices
from sgl_core.transfer.copy._stream_table import _stretches, slice_ops

Array = np.ndarray[Any, Any]

needs_stream = pytest.mark.skipif(
    _stream.stream_copy() is None, reason=f"streaming copy: {_stream.stream_copy_status()}"
)

LAYERS, WORDS, PAGE = 5, 8, 4  # 64-byte rows: 8 uint64 words per token and layer


def _stacked(pages: int, seed: int) -> Array:
    """A stacked device buffer ``(layers, pages, page, words)`` of random words."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 62, (LAYERS, pages, PAGE, WORDS), dtype=np.uint64)


def _case(layout: str) -> tuple[Array, Array, list[tuple[int, int, int]]]:
    """A stacked backup's two sides as ``slices_step`` sees them (units along axis 0 of
    both) and its runs (source unit, destination unit, count), in no source order."""
    dev = _stacked(12, 1)
    if layout == "page_first":  # a host page holds each token's layers together
        host = np.full((10, PAGE, LAYERS, WORDS), 7, dtype=np.uint64)
        return host, dev.transpose(1, 2, 0, 3), [(9, 2, 1), (1, 7, 1), (4, 0, 1), (10, 5, 1)]
    if layout == "page_first_direct":  # a host page holds each layer's tokens together
        host = np.full((10, LAYERS, PAGE, WORDS), 7, dtype=np.uint64)
        return host, dev.transpose(1, 0, 2, 3), [(9, 2, 1), (1, 7, 1), (4, 0, 1), (10, 5, 1)]
    # layer_first: token rows on both sides, runs of several tokens (one piece per layer)
    tokens = dev.reshape(LAYERS, -1, WORDS).transpose(1, 0, 2)
    host = np.full((LAYERS, 40, WORDS), 7, dtype=np.uint64).transpose(1, 0, 2)
    return host, tokens, [(36, 4, 8), (2, 20, 4), (17, 30, 3), (28, 12, 1)]


def _rows(ops: Array) -> list[tuple[int, ...]]:
    return sorted(tuple(int(x) for x in row) for row in ops)


@needs_stream
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_a_backups_table_reads_the_stacked_source_in_address_order(layout: str) -> None:
    """Every (dst, src, len) piece of item order, once, in ascending source address (a
    stacked source: each layer's stretches of every unit before the next layer's), and
    the copy bit-exact with the destination's other bytes untouched."""
    dst, src, runs = _case(layout)
    by_item, by_source = slice_ops(dst, src, runs), slice_ops(dst, src, runs, by_source=True)
    assert _rows(by_source) == _rows(by_item)
    assert (np.diff(by_source[:, 1].astype(np.int64)) > 0).all()
    assert not (np.diff(by_item[:, 1].astype(np.int64)) > 0).all()  # the test can tell
    want = dst.copy()
    copy_slices(want, src, runs)
    _stream.stream_each(by_source)
    assert np.array_equal(dst, want)


@needs_stream
def test_page_first_pieces_go_layer_by_layer_across_units() -> None:
    """``page_first``: a unit's source is one stretch of ``PAGE`` rows per layer, so the
    table holds layer 0 of every unit (in source order), then layer 1, and so on."""
    dst, src, runs = _case("page_first")
    ops = slice_ops(dst, src, runs, by_source=True)
    layer_bytes = src.strides[2]
    layers = (ops[:, 1].astype(np.int64) - src.ctypes.data) // layer_bytes
    assert layers.tolist() == [lay for lay in range(LAYERS) for _ in range(len(runs) * PAGE)]
    first_units = ops[: len(runs) * PAGE : PAGE, 0].astype(np.int64) - dst.ctypes.data
    assert (first_units // dst.strides[0]).tolist() == [7, 0, 2, 5]  # source units 1, 4, 9, 10


@pytest.mark.parametrize(
    ("blocks", "count"),
    [
        ([0], 1),  # one piece
        ([0, 1, 2], 1),  # one stretch
        ([0, 1, 3, 4], 2),
        ([0, 2, 4], 3),  # every piece apart
        ([0, 1, 3, 4, 5, 6], 1),  # stretches of 2 and 4
        ([0, 2, 3], 1),  # of 1 and 2
        ([0, 2, 3, 5], 1),  # 1, 2 and 1: as many pieces as stretches times a length
        ([0, 1, 2, 4, 6, 7], 1),  # 3, 1 and 2
    ],
)
def test_stretches_counts_equal_contiguous_stretches_only(blocks: list[int], count: int) -> None:
    cut = np.asarray(blocks, dtype=np.int64) * 64
    assert _stretches(cut, 64) == count


@needs_stream
def test_uneven_stretches_keep_each_units_pieces_together_in_source_order() -> None:
    """A unit whose source stretches differ in length (blocks 0, 2, 3 and 5 of six): the
    units in source order, each unit's pieces by source offset; bit-exact."""
    rng = np.random.default_rng(4)
    base = rng.integers(0, 1 << 62, (9 * 6, WORDS), dtype=np.uint64)
    row = WORDS * 8
    src = np.lib.stride_tricks.as_strided(
        base, (9, 2, 2, WORDS), (6 * row, 2 * row, 3 * row, 8), writeable=False
    )
    dst = np.full((6, 2, 2, WORDS), 7, dtype=np.uint64)
    runs = [(8, 0, 1), (3, 1, 2), (0, 5, 1)]
    ops = slice_ops(dst, src, runs, by_source=True)
    offsets = (ops[:, 1].astype(np.int64) - base.ctypes.data) // row
    assert offsets.tolist() == [0, 2, 3, 5, 18, 20, 21, 23, 24, 26, 27, 29, 48, 50, 51, 53]
    assert _rows(ops) == _rows(slice_ops(dst, src, runs))
    want = dst.copy()
    copy_slices(want, src, runs)
    _stream.stream_each(ops)
    assert np.array_equal(dst, want)


def test_a_row_gathers_table_keeps_the_index_pairs_order() -> None:
    """Row gathers (a page-1 backup's rows, a ``take`` load) stay in the index pairs'
    order: rows in source order measured no faster there (BENCHMARKS.md)."""
    src = np.zeros((40, WORDS), dtype=np.uint64)
    dst = np.zeros((30, WORDS), dtype=np.uint64)
    s_rows, d_rows = np.array([33, 2, 17, 9]), np.array([0, 5, 29, 11])
    ops = _stream_table.rows_ops(dst, src, d_rows, s_rows)
    row = WORDS * 8
    assert ((ops[:, 1].astype(np.int64) - src.ctypes.data) // row).tolist() == [33, 2, 17, 9]
    assert ((ops[:, 0].astype(np.int64) - dst.ctypes.data) // row).tolist() == [0, 5, 29, 11]
