"""page_keys: chained SHA-256 keys per full page."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sgl_core.l3 import page_keys


def test_first_key_is_documented_hash() -> None:
    toks = list(range(4))
    expect = hashlib.sha256(b"\x00" + struct.pack("<4q", *toks)).hexdigest()
    assert page_keys(toks, 4) == [expect]


def test_partial_trailing_page_has_no_key() -> None:
    assert len(page_keys(list(range(10)), 4)) == 2
    assert page_keys([1, 2, 3], 4) == []


@given(st.lists(st.integers(0, 2**31), min_size=0, max_size=40), st.integers(1, 8))
def test_chain_continues_with_prior_key(toks: list[int], page: int) -> None:
    keys = page_keys(toks, page)
    cut = (len(keys) // 2) * page
    head = page_keys(toks[:cut], page)
    tail = page_keys(toks[cut:], page, prior_key=head[-1] if head else None)
    assert head + tail == keys


def test_prefix_keys_are_shared_and_divergence_changes_the_rest() -> None:
    a = page_keys([1, 2, 3, 4, 5, 6], 2)
    b = page_keys([1, 2, 3, 4, 9, 6], 2)
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    # The same page after a different prefix gets a different key.
    assert page_keys([0, 0, 5, 6], 2)[1] != a[2]


def test_tensor_and_list_agree_and_namespace_prefixes() -> None:
    toks = [7, 8, 9, 10]
    assert page_keys(torch.tensor(toks), 2) == page_keys(toks, 2)
    keys = page_keys(toks, 2, namespace="m/")
    assert all(k.startswith("m/") for k in keys)
    assert keys != page_keys(toks, 2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_page_size(bad: object) -> None:
    with pytest.raises(ValueError, match="page_size"):
        page_keys([1, 2], bad)  # type: ignore[arg-type]


def test_bad_tokens() -> None:
    with pytest.raises(ValueError, match="token_ids"):
        page_keys(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="token_ids"):
        page_keys(["a", "b"], 2)  # type: ignore[list-item]
