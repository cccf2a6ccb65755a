"""The direct-copy engine against plain per-index loops, bit for bit."""

from __future__ import annotations

import pytest
import torch

from sgl_core.backend import IndexRuns, RunSide, copy_runs, gather_rows, merge_runs
from sgl_core.transfer.copy._engine import reusable_after


def _bits(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), generator=gen)
    return raw.to(torch.uint8).view(dtype)


def _u8(t: torch.Tensor) -> torch.Tensor:
    """Bytes (random bits include NaNs, which never compare equal as floats)."""
    return t.contiguous().view(torch.uint8)


def _runs(a: list[int], b: list[int], unit: int = 1) -> IndexRuns:
    return merge_runs(torch.tensor(a), torch.tensor(b), unit=unit)


@pytest.mark.parametrize("runs_outer", [False, True])
@pytest.mark.parametrize("into_first", [False, True])
def test_copy_runs_rows(into_first: bool, runs_outer: bool) -> None:
    a_idx, b_idx = [4, 5, 6, 0, 9], [1, 2, 3, 7, 0]
    a = [_bits((10, 3, 8), 1), _bits((10, 3, 8), 2)]
    b = [_bits((8, 3, 8), 3), _bits((8, 3, 8), 4)]
    want_a, want_b = [t.clone() for t in a], [t.clone() for t in b]
    for wa, wb in zip(want_a, want_b, strict=True):
        for i, j in zip(a_idx, b_idx, strict=True):
            if into_first:
                wa[i] = wb[j]
            else:
                wb[j] = wa[i]
    pairs = [(RunSide(x), RunSide(y)) for x, y in zip(a, b, strict=True)]
    copy_runs(
        _runs(a_idx, b_idx), pairs, into_first=into_first, batched=False, runs_outer=runs_outer
    )
    for got, want in zip(a + b, want_a + want_b, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_run_side_pages_axis_and_transpose() -> None:
    """Page views slice first (rows need not be whole pages); transposed sides keep bytes."""
    ps, layers = 4, 3
    dev = _bits((layers, 6 * ps + 2, 8), 5)  # (layer, token, dim), not whole pages
    host = _bits((5, layers, ps, 8), 6)  # (page, layer, token in page, dim)
    h_pages, d_pages = [1, 2, 4], [5, 0, 1]
    want = host.clone()
    for h, d in zip(h_pages, d_pages, strict=True):
        want[h] = dev[:, d * ps : (d + 1) * ps]
    runs = _runs([h * ps for h in h_pages], [d * ps for d in d_pages], unit=ps)
    pair = (RunSide(host, unit=ps), RunSide(dev, axis=1, page=ps, transpose=True))
    copy_runs(runs, (pair,), into_first=True, batched=True)
    assert torch.equal(host.view(torch.uint8), want.view(torch.uint8))
    layer = _bits((6 * ps + 2, 8), 7)  # one device layer, loaded per page
    copy_runs(runs, ((RunSide(host[:, 1], unit=ps), RunSide(layer, page=ps)),), into_first=False,
              batched=False)  # fmt: skip
    for h, d in zip(h_pages, d_pages, strict=True):
        assert torch.equal(_u8(layer[d * ps : (d + 1) * ps]), _u8(host[h, 1]))


def test_gather_rows_axis_one_and_out_buffer() -> None:
    dev = _bits((2, 6, 4, 8), 8, torch.float8_e4m3fn)  # fp8: moved as bytes
    host = _bits((7, 2, 4, 8), 9, torch.float8_e4m3fn)
    h_idx, d_idx = torch.tensor([6, 0, 3]), torch.tensor([1, 5, 2])
    want = host.view(torch.uint8).clone()
    want[h_idx] = dev.view(torch.uint8)[:, d_idx].transpose(0, 1)
    gather_rows([host], [dev], h_idx, d_idx, axis=1)
    assert torch.equal(host.view(torch.uint8), want)
    layer = _bits((6, 8), 10)
    rows = _bits((7, 8), 11)
    out = torch.empty((3, 8), dtype=rows.dtype)
    want_layer = layer.clone()
    want_layer[d_idx] = rows[h_idx]
    gather_rows([layer], [rows], d_idx, h_idx, out=out)
    assert torch.equal(_u8(layer), _u8(want_layer))
    assert torch.equal(_u8(out), _u8(rows[h_idx]))


@pytest.mark.parametrize(
    ("shape", "side", "spans"),
    [
        ((10, 3, 8), {}, [(4, 3), (0, 1), (9, 1)]),
        ((3, 10, 8), {"axis": 1}, [(2, 5), (9, 1)]),
        ((3, 10, 8), {"axis": 1, "transpose": True}, [(2, 5), (0, 2)]),
        ((12, 2, 8), {"unit": 4}, [(4, 8), (3, 2), (0, 4)]),  # unit steps round down
        ((3, 4 * 4 + 2, 8), {"axis": 1, "page": 4}, [(8, 4), (0, 8)]),  # not whole pages
        ((3, 16, 8), {"axis": 1, "page": 4, "transpose": True}, [(8, 4), (0, 8)]),
        ((16, 8), {"page": 4, "transpose": True}, [(12, 4), (4, 8)]),
        ((3, 16, 8), {"axis": 1, "page": 4}, [(8, 4), (2, 4)]),  # a span off a page boundary
    ],
)
def test_run_side_blocks_are_the_block_views(
    shape: tuple[int, ...], side: dict[str, int], spans: list[tuple[int, int]]
) -> None:
    """``blocks`` builds exactly ``block``'s views (shape, strides, offset), cheaper."""
    rs = RunSide(_bits(shape, 12), **side)
    got = rs.blocks(spans)
    want = [rs.block(start, length) for start, length in spans]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert g.stride() == w.stride()
        assert g.data_ptr() == w.data_ptr()


@pytest.mark.parametrize(
    ("side", "spans"),
    [
        ({}, [(0, 2), (9, 2)]),
        ({}, [(0, 2), (-1, 1)]),
        ({}, [(11, 0)]),
        ({"unit": 2, "page": 2}, [(0, 4)]),  # no page split of unit steps
    ],
)
def test_run_side_blocks_keep_blocks_errors(
    side: dict[str, int], spans: list[tuple[int, int]]
) -> None:
    """Spans ``block`` rejects raise as there (a slice would clamp them silently)."""
    rs = RunSide(_bits((10, 8), 13), **side)
    try:
        want = [rs.block(start, length) for start, length in spans]
    except (IndexError, RuntimeError) as exc:
        with pytest.raises(type(exc)):
            rs.blocks(spans)
        return
    got = rs.blocks(spans)
    assert [(g.shape, g.data_ptr()) for g in got] == [(w.shape, w.data_ptr()) for w in want]


def test_gather_rows_shares_one_buffer_across_pairs() -> None:
    """Pairs of one shape reuse the first gather's buffer; other shapes get their own."""
    import warnings

    srcs = [_bits((6, 8), 20 + i) for i in range(3)] + [_bits((6, 4), 23)]
    dsts = [_bits((5, 8), 30 + i) for i in range(3)] + [_bits((5, 4), 33)]
    want = [d.clone() for d in dsts]
    h_idx, d_idx = torch.tensor([4, 0]), torch.tensor([1, 3])
    for w, s in zip(want, srcs, strict=True):
        w[h_idx] = s[d_idx]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a reused buffer of another shape would be resized
        gather_rows(dsts, srcs, h_idx, d_idx)
    for got, w in zip(dsts, want, strict=True):
        assert torch.equal(_u8(got), _u8(w))


def test_gather_buffer_reuse_waits_for_async_copies_to_accelerators() -> None:
    cpu, acc = torch.device("cpu"), torch.device("cuda", 0)
    assert reusable_after(cpu, cpu, non_blocking=True)
    assert reusable_after(acc, cpu, non_blocking=True)  # device -> CPU copies block
    assert reusable_after(acc, acc, non_blocking=True)  # stream-ordered on one device
    assert reusable_after(cpu, acc, non_blocking=False)
    assert not reusable_after(cpu, acc, non_blocking=True)
