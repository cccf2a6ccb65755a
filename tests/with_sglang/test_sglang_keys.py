"""``page_keys(..., scheme="sglang")`` against SGLang's own page hash function.

SGLang hashes pages in a C++ extension it compiles on first use (g++, ninja
and OpenSSL headers; cached afterwards).
"""

from __future__ import annotations

import random

import pytest

from sgl_core.l3 import page_keys

from sglang.srt.mem_cache.utils import get_hash_str, get_storage_hash_str  # isort: skip


def _cases() -> list[tuple[list[int], int]]:
    rng = random.Random(13)
    cases = [
        (list(range(64)), 16),
        ([0] * 8, 1),
        ([2**32 - 1, 2**32, 7, 8], 2),  # the second page is wide (> uint32)
        ([5, 2**63 - 1, 1, 2], 4),
    ]
    for page_size in (1, 3, 16, 64):
        n = page_size * rng.randint(1, 5)
        cases.append(([rng.randrange(0, 200_000) for _ in range(n)], page_size))
    return cases


@pytest.mark.parametrize(("tokens", "page_size"), _cases())
def test_keys_are_sglangs(tokens: list[int], page_size: int) -> None:
    ours = page_keys(tokens, page_size, scheme="sglang")
    assert ours == get_hash_str(tokens, None, page_size=page_size)
    assert ours == get_storage_hash_str(tokens, None, page_size=page_size)
    # Continuing a chain from a prior key, as the controller does for prefetch.
    if len(ours) >= 2:
        tail = tokens[page_size:]
        assert page_keys(tail, page_size, ours[0], scheme="sglang") == ours[1:]
        assert get_hash_str(tail, ours[0], page_size=page_size) == ours[1:]


def test_trailing_partial_page_gets_no_key() -> None:
    """SGLang also hashes a partial last page; a partial page is never stored here."""
    tokens = list(range(10))
    theirs = get_hash_str(tokens, None, page_size=4)
    assert len(theirs) == 3
    assert page_keys(tokens, 4, scheme="sglang") == theirs[:2]
