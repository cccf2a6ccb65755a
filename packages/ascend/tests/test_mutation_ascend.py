"""Boundary tests of the kv-split copy plan and its by-address blocks (issue #18)."""

from __future__ import annotations

import pytest
import torch

from sgl_ascend import _transfer
from sgl_core.backend import CopyTuning, memmove_step
from sgl_core.testing import page_indices

PS, DIM = 4, 3
HOST_PAGES, DEV_PAGES, ROWS = 6, 5, 3


def components(dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """A host (pages, rows, page, 1, dim) and a device (rows, pages, page, 1, dim) component."""
    host = torch.arange(HOST_PAGES * ROWS * PS * DIM, dtype=torch.int16).view(dtype)
    dev = torch.zeros(ROWS * DEV_PAGES * PS * DIM, dtype=dtype)
    return host.view(HOST_PAGES, ROWS, PS, 1, DIM), dev.view(ROWS, DEV_PAGES, PS, 1, DIM)


def plan(host_pages: list[int], dev_pages: list[int], page_size: int = PS) -> _transfer.PagePlan:
    return _transfer.plan_pages(
        page_indices(host_pages, page_size), page_indices(dev_pages, page_size), page_size
    )


def test_plan_pages_counts_pages_and_runs() -> None:
    p = plan([3, 4, 0, 5], [1, 2, 3, 4])
    assert p.host_pages.tolist() == [3, 4, 0, 5] and p.device_pages.tolist() == [1, 2, 3, 4]
    assert p.num_pages == 4
    assert list(p.runs) == [(3, 1, 2), (0, 3, 1), (5, 4, 1)]
    one = plan([2, 3], [7, 8], page_size=1)
    assert one.num_pages == 2 and list(one.runs) == [(2, 7, 2)]
    empty = plan([], [])
    assert empty.num_pages == 0 and len(empty.runs) == 0


def test_page_bytes() -> None:
    host, _ = components()
    assert _transfer._page_bytes(host, 1) == PS * DIM * 2
    assert _transfer._page_bytes(host, ROWS) == ROWS * PS * DIM * 2
    assert _transfer._page_bytes(host.view(torch.uint8), 2) == 2 * PS * (2 * DIM)


def test_short_runs_boundaries() -> None:
    two_runs = plan([0, 2], [0, 2])  # 2 pages in 2 runs
    one_run = plan([0, 1], [0, 1])
    tune = CopyTuning(gather_below_page_run_bytes=100)
    assert _transfer._short_runs(two_runs, 99, tune)  # 198 < 200
    assert not _transfer._short_runs(two_runs, 100, tune)  # 200 == 200: not short
    assert not _transfer._short_runs(one_run, 1, tune)  # one run is never gathered
    assert not _transfer._short_runs(plan([], []), 1, tune)
    three = plan([0, 2, 4], [0, 2, 4])
    assert _transfer._short_runs(three, 99, tune) and not _transfer._short_runs(three, 101, tune)


@pytest.mark.parametrize("row", [0, ROWS - 1])
def test_row_addresses_point_at_the_planned_pages(row: int) -> None:
    host, dev = components()
    host2, dev2 = components(torch.bfloat16)
    p = plan([5, 0, 2], [4, 1, 0])
    blocks = _transfer._row_addresses([(host, dev, row), (host2, dev2, row)], p)
    assert blocks is not None
    dst, src, sizes = blocks
    expect_src = [host[h, row].data_ptr() for h in (5, 0, 2)]
    expect_src += [host2[h, row].data_ptr() for h in (5, 0, 2)]
    expect_dst = [dev[row, d].data_ptr() for d in (4, 1, 0)]
    expect_dst += [dev2[row, d].data_ptr() for d in (4, 1, 0)]
    assert src == expect_src and dst == expect_dst
    assert sizes == [PS * DIM * 2] * 6
    memmove_step(dst, src, sizes, 1).run()
    for h, d in ((5, 4), (0, 1), (2, 0)):
        assert torch.equal(dev[row, d].view(torch.int16), host[h, row].view(torch.int16))
    untouched = [r for r in range(ROWS) if r != row]
    assert not dev[untouched].view(torch.int16).any()
    assert not dev[row, 2:4].view(torch.int16).any()


def test_row_addresses_recheck_every_bound() -> None:
    host, dev = components()
    last = plan([HOST_PAGES - 1], [DEV_PAGES - 1])
    assert _transfer._row_addresses([(host, dev, ROWS - 1)], last) is not None
    bad = [
        (plan([HOST_PAGES], [0]), ROWS - 1),
        (plan([0], [DEV_PAGES]), 0),
        (last, ROWS),
        (last, -1),
    ]
    for p, row in bad:
        with pytest.raises(RuntimeError, match="validated pages out of range"):
            _transfer._row_addresses([(host, dev, row)], p)
    # the row bound is the smaller of the two sides' row counts
    narrow_dev = dev[: ROWS - 1].clone()
    with pytest.raises(RuntimeError):
        _transfer._row_addresses([(host, narrow_dev, ROWS - 1)], last)
    narrow_host = host[:, : ROWS - 1].clone()
    with pytest.raises(RuntimeError):
        _transfer._row_addresses([(narrow_host, dev, ROWS - 1)], last)


def test_row_addresses_refuse_strided_components() -> None:
    host, dev = components()
    p = plan([0], [0])
    assert _transfer._row_addresses([(host[::2], dev, 0)], p) is None
    assert _transfer._row_addresses([(host, dev[:, ::2], 0)], p) is None
    assert _transfer._row_addresses([(host, dev, 0), (host, dev.transpose(1, 2), 0)], p) is None
