"""Both page stores (file, Mooncake) over vLLM's primary-tier chunk rows (``ChunkRows``).

What ``SglPageStoreTier`` does per job, without vLLM: a store registers the
rows (Mooncake registers their one buffer for zero-copy transfers), writes
rows as pages, and a second set of rows of the same format reads them back
byte for byte; rows of another format (another model here) get a miss and no
byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sgl_core.integrations.vllm import ChunkRows

ROW, CHUNKS, TOKENS = 8192, 4, 16


def _rows(seed: int, model: str) -> tuple[np.ndarray, ChunkRows]:
    data = np.random.default_rng(seed).integers(-128, 128, (CHUNKS, ROW), dtype=np.int8)
    rows = ChunkRows(
        memoryview(data),
        tokens_per_chunk=TOKENS,
        layer_num=2,
        dtype=torch.bfloat16,
        fields={"model": model},
    )
    return data, rows


def test_chunk_rows_round_trip_and_another_format_misses(
    make_store: Callable[[], Any], ns: str
) -> None:
    keys = [f"{ns}a", f"{ns}b"]
    src, rows = _rows(0, "org/llama-like")
    store = make_store()
    store.register_host_pool(rows.as_host_pool())
    assert store.batch_set(keys, rows.tokens([3, 1])) == [True, True]

    other, other_rows = _rows(1, "org/other-model")
    before = other.copy()
    store = make_store()
    store.register_host_pool(other_rows.as_host_pool())
    assert store.batch_exists(keys) == 0
    assert store.batch_get(keys, other_rows.tokens([0, 2])) == [False, False]
    assert np.array_equal(other, before)

    dst, same = _rows(2, "org/llama-like")
    store = make_store()
    store.register_host_pool(same.as_host_pool())
    assert store.batch_exists(keys) == 2
    assert store.batch_get(keys, same.tokens([0, 2])) == [True, True]
    assert np.array_equal(dst[0], src[3]) and np.array_equal(dst[2], src[1])
