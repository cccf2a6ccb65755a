"""The index checks read CPU indices with numpy (no ATen op, so no OpenMP team that
could wait for a busy core): ``check_unique`` (an accelerator's indices counted with
``torch.unique``; both count right on the mask and the sort path), the bounds and the
page-run checks (``index_values``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from sgl_core import errors
from sgl_core.kv._validation import (
    check_index_bounds,
    check_page_runs,
    check_unique,
    index_values,
)
from sgl_core.transfer.copy._pieces import MASK_SPAN, distinct_count, index_array


def aten_ops(call: Any) -> set[str]:
    """The names of the ops the torch profiler records while ``call()`` runs."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return {event.name for event in prof.events()}


def test_cpu_indices_start_no_aten_op_beyond_the_numpy_view() -> None:
    idx = (torch.randperm(1024)[:256, None] * 16 + torch.arange(16)).flatten()
    view_only = aten_ops(lambda: index_array(idx))  # what handing the tensor to numpy records
    assert aten_ops(lambda: check_unique(idx, "idx", 16384)) <= view_only
    assert aten_ops(lambda: check_unique(idx, "idx")) <= view_only
    dup = idx.clone()
    dup[-1] = dup[0]

    def rejected() -> None:
        with pytest.raises(errors.DuplicateIndexError):
            check_unique(dup, "idx", 16384)

    assert aten_ops(rejected) <= view_only
    # the probe is not vacuous: the torch count records its ops
    assert "aten::_unique2" in aten_ops(lambda: torch.unique(idx))


def test_accelerator_indices_are_counted_by_torch_unique(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Non-CPU indices never reach numpy; ``torch.unique``'s count decides."""
    calls: list[torch.device] = []
    answer = {"distinct": 3}

    def fake_unique(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.device)
        return torch.empty(answer["distinct"])

    monkeypatch.setattr(torch, "unique", fake_unique)
    meta = torch.empty(3, dtype=torch.int64, device="meta")
    check_unique(meta, "idx", 8)
    answer["distinct"] = 2
    with pytest.raises(errors.DuplicateIndexError, match="idx contains duplicate"):
        check_unique(meta, "idx", 8)
    assert calls == [torch.device("meta")] * 2


@pytest.mark.parametrize("limit", [None, 3, MASK_SPAN * 3, MASK_SPAN * 3 + 1, 1 << 30])
def test_distinct_count_on_both_paths(limit: int | None) -> None:
    """The mask (limit <= MASK_SPAN x the count) and the sort count alike."""
    assert distinct_count(np.array([1, 0, 2], dtype=np.int64), limit) == 3
    assert distinct_count(np.array([2, 2, 0], dtype=np.int64), limit) == 2
    assert distinct_count(np.array([0, 0], dtype=np.int64), limit) == 1
    assert distinct_count(np.array([2, 1, 2, 1], dtype=np.int32), limit) == 2


@pytest.mark.parametrize("limit", [None, 64, 1 << 20])
def test_strided_and_int32_cpu_indices(limit: int | None) -> None:
    base = torch.tensor([5, 9, 6, 7, 5, 11], dtype=torch.int64)
    check_unique(base[1::2], "idx", limit)  # 9, 7, 11
    check_unique(base[:4:2], "idx", limit)  # 5, 6
    with pytest.raises(errors.DuplicateIndexError):
        check_unique(base[::2], "idx", limit)  # 5, 6, 5
    check_unique(torch.tensor([4, 1, 0], dtype=torch.int32), "idx", limit)
    with pytest.raises(errors.DuplicateIndexError):
        check_unique(torch.tensor([4, 1, 4], dtype=torch.int32), "idx", limit)


def test_bounds_and_page_runs_of_cpu_indices_start_no_aten_op() -> None:
    idx = (torch.randperm(1024)[:256, None] * 16 + torch.arange(16)).flatten()
    view_only, flipped = aten_ops(lambda: index_array(idx)), idx.flip(0)
    assert aten_ops(lambda: check_index_bounds(idx, 16384, "idx")) <= view_only
    assert aten_ops(lambda: check_page_runs(idx, 16, "idx")) <= view_only

    def refused() -> None:
        with pytest.raises(errors.IndexOutOfRangeError):
            check_index_bounds(idx, 100, "idx")
        with pytest.raises(errors.PageAlignmentError):
            check_page_runs(flipped, 16, "idx")

    assert aten_ops(refused) <= view_only


def test_index_values_keeps_accelerator_indices_as_tensors() -> None:
    cpu = torch.tensor([4, 1])
    assert isinstance(index_values(cpu), np.ndarray) and index_values(cpu).tolist() == [4, 1]
    meta = torch.empty(2, dtype=torch.int64, device="meta")
    assert index_values(meta) is meta
