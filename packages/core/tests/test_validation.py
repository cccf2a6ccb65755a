from __future__ import annotations

import pytest
import torch

from sgl_core import errors
from sgl_core.kv._validation import (
    check_index_bounds,
    check_index_pair,
    check_layer_id,
    check_page_runs,
    check_unique,
)
from sgl_core.transfer.copy._pieces import merge_runs


def test_index_checks_name_the_argument() -> None:
    with pytest.raises(errors.IndexDTypeError, match="host_indices"):
        check_index_pair(torch.arange(3, dtype=torch.int32), "host_indices", torch.arange(3), "d")
    with pytest.raises(errors.IndexShapeError, match="equal length"):
        check_index_pair(torch.arange(3), "a", torch.arange(4), "b")
    with pytest.raises(errors.IndexOutOfRangeError, match=r"device_indices holds 10"):
        check_index_bounds(torch.tensor([1, 10]), 10, "device_indices")
    with pytest.raises(errors.IndexOutOfRangeError, match="-1"):
        check_index_bounds(torch.tensor([-1, 2]), 10, "x")
    with pytest.raises(errors.DuplicateIndexError):
        check_unique(torch.tensor([4, 5, 4]), "host_indices")
    with pytest.raises(errors.LayerIndexError):
        check_layer_id(3, 3)
    with pytest.raises(errors.ArgumentTypeError):
        check_layer_id(True, 3)
    with pytest.raises(TypeError):
        check_layer_id("1", 3)


def test_page_runs() -> None:
    check_page_runs(torch.tensor([4, 5, 6, 7, 0, 1, 2, 3]), 4, "i")
    with pytest.raises(errors.PageAlignmentError, match="whole number of pages"):
        check_page_runs(torch.tensor([4, 5, 6]), 4, "i")
    with pytest.raises(errors.PageAlignmentError, match="whole pages"):
        check_page_runs(torch.tensor([5, 6, 7, 8]), 4, "i")
    with pytest.raises(errors.PageAlignmentError):
        check_page_runs(torch.tensor([4, 6, 5, 7]), 4, "i")


def test_merge_runs_merges_only_where_both_sides_step() -> None:
    src = torch.tensor([0, 1, 2, 7, 8, 3])
    dst = torch.tensor([5, 6, 7, 8, 20, 21])
    runs = merge_runs(src, dst)
    assert list(runs) == [(0, 5, 3), (7, 8, 1), (8, 20, 1), (3, 21, 1)]
    pages = merge_runs(torch.tensor([0, 16, 48]), torch.tensor([32, 48, 64]), unit=16)
    assert list(pages) == [(0, 32, 32), (48, 64, 16)]
    assert (
        len(merge_runs(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))) == 0
    )


def test_copy_each_copies_every_pair_including_strided() -> None:
    from sgl_core.transfer.copy._copy import copy_batched, copy_each

    src = [torch.arange(12.0).view(3, 4), torch.arange(12.0).view(3, 4).t(), torch.ones(5)]
    dst = [torch.zeros(3, 4), torch.zeros(4, 3), torch.zeros(5)]
    copy_each(dst, src)  # the cross-device path, exercised on one device
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
    dst = [torch.zeros(3, 4), torch.zeros(4, 3), torch.zeros(5)]
    copy_batched(dst, src)  # strided pairs split into contiguous pieces, the rest blocking
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
