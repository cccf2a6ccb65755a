"""``moe_align_block_size`` on its own, against a plain-Python statement of the layout."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_core.errors import IndexDTypeError, IndexOutOfRangeError, ShapeMismatchError
from sgl_cuda.quantization import moe_align_block_size
from sgl_cuda.quantization._align import max_padded_pairs


def _expected(ids: list[int], block_m: int, e: int) -> tuple[list[int], list[int], int]:
    """Pairs grouped by expert in expert order, each run padded with ``len(ids)``."""
    pairs = len(ids)
    sorted_ids: list[int] = []
    expert_ids: list[int] = []
    for expert in range(e):
        run = [p for p, x in enumerate(ids) if x == expert]
        if not run:
            continue
        blocks = -(-len(run) // block_m)
        sorted_ids += run + [pairs] * (blocks * block_m - len(run))
        expert_ids += [expert] * blocks
    num_blocks = -(-max_padded_pairs(pairs, e, block_m) // block_m)
    total = len(sorted_ids)
    sorted_ids += [pairs] * (num_blocks * block_m - total)
    expert_ids += [-1] * (num_blocks - len(expert_ids))
    return sorted_ids, expert_ids, total


def _check(topk_ids: torch.Tensor, block_m: int, e: int) -> None:
    s, ex, n = moe_align_block_size(topk_ids, block_m, e)
    assert s.dtype == ex.dtype == n.dtype == torch.int32
    want_s, want_e, want_n = _expected(topk_ids.flatten().tolist(), block_m, e)
    assert s.tolist() == want_s
    assert ex.tolist() == want_e
    assert n.tolist() == [want_n]
    assert want_n % block_m == 0


@pytest.mark.parametrize("top_k", [1, 8])
def test_uneven_loads_and_idle_experts(top_k: int) -> None:
    # 16 experts; expert 3 takes most pairs, experts 0, 1, 7, 15 take none
    tokens, e = 9, 16
    rows = []
    for t in range(tokens):
        others = [x for x in (2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14) if x != t % 11]
        rows.append([3, *others][:top_k])
    ids = torch.tensor(rows, dtype=torch.int32)
    for block_m in (1, 4, 16):
        _check(ids, block_m, e)
    _, ex, _ = moe_align_block_size(ids, 4, e)
    assert 0 not in ex.tolist() and 15 not in ex.tolist()  # idle experts take no block
    assert ex.tolist().count(3) == -(-tokens // 4)


def test_all_pairs_to_one_expert_and_int64_ids() -> None:
    ids = torch.full((5, 1), 2, dtype=torch.int64)
    s, ex, n = moe_align_block_size(ids, 4, 3)
    assert s.tolist()[:8] == [0, 1, 2, 3, 4, 5, 5, 5]
    assert ex.tolist()[:2] == [2, 2] and set(ex.tolist()[2:]) <= {-1}
    assert n.item() == 8


def test_no_pairs() -> None:
    s, ex, n = moe_align_block_size(torch.zeros((0, 8), dtype=torch.int32), 16, 4)
    assert s.numel() == ex.numel() == 0
    assert n.tolist() == [0]


def test_argument_errors() -> None:
    with pytest.raises(IndexDTypeError):
        moe_align_block_size(torch.zeros(4, 2), 16, 4)
    with pytest.raises(ShapeMismatchError):
        moe_align_block_size(torch.zeros((4, 2), dtype=torch.int32), 0, 4)
    with pytest.raises(ShapeMismatchError):
        moe_align_block_size(torch.zeros((4, 2), dtype=torch.int32), 16, 0)
    for bad in (4, -1):  # an id out of range: typed, not an IndexError from a gather
        ids = torch.tensor([[0, 1], [bad, 2]], dtype=torch.int32)
        with pytest.raises(IndexOutOfRangeError, match=str(bad)):
            moe_align_block_size(ids, 16, 4)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    tokens=st.integers(0, 12),
    top_k=st.integers(1, 4),
    e=st.integers(1, 9),
    block_m=st.sampled_from([1, 2, 3, 16]),
    seed=st.integers(0, 1000),
)
def test_property(*, tokens: int, top_k: int, e: int, block_m: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, e, (tokens, top_k), generator=g, dtype=torch.int32)
    _check(ids, block_m, e)
    s, ex, n = moe_align_block_size(ids, block_m, e)
    pairs = tokens * top_k
    real = s[s < pairs]
    assert sorted(real.tolist()) == list(range(pairs))  # every pair exactly once
    blocks = s[: n.item()].view(-1, block_m)
    flat = ids.flatten().long()
    for b, row in enumerate(blocks):  # each block holds pairs of its expert only
        members = row[row < pairs].long()
        assert members.numel() > 0
        assert (flat[members] == ex[b]).all()
