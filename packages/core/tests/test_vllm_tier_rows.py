"""vLLM's primary-tier chunk rows as a page store's host pool (``ChunkRows``), no vLLM needed.

The rows are a memoryview like the one vLLM's tiering manager hands a
secondary tier; a ``FilePageStore`` over them keeps one row per page under our
record. Rows of another format are a miss, a corrupt record is a miss, and
neither writes a byte into the rows. The tier itself, driven by vLLM's
tiering manager, is tested in ``tests/with_vllm/test_vllm_tiering.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sgl_core.errors import ArgumentTypeError, IndexOutOfRangeError, PoolMismatchError
from sgl_core.integrations.vllm import ChunkRows
from sgl_core.integrations.vllm._tier import _make_store
from sgl_core.l3 import FilePageStore

ROW, CHUNKS, TOKENS = 4096, 4, 16
FIELDS = {"model": "org/llama-like", "blocks_per_chunk": 1}


def _rows(seed: int, **fields: object) -> tuple[np.ndarray, ChunkRows]:
    data = np.random.default_rng(seed).integers(-128, 128, (CHUNKS, ROW), dtype=np.int8)
    rows = ChunkRows(
        memoryview(data),
        tokens_per_chunk=TOKENS,
        layer_num=3,
        dtype=torch.bfloat16,
        fields={**FIELDS, **fields},
    )
    return data, rows


def _store(root: Path, rows: ChunkRows) -> FilePageStore:
    store = FilePageStore(root)
    store.register_host_pool(rows.as_host_pool())
    return store


def test_rows_round_trip_through_the_store(tmp_path: Path) -> None:
    src, rows = _rows(0)
    keys = ["aa", "bb"]
    assert _store(tmp_path, rows).batch_set(keys, rows.tokens([2, 0])) == [True, True]
    dst, other = _rows(1)
    before = dst.copy()
    store = _store(tmp_path, other)
    assert store.batch_exists(keys) == 2
    assert store.batch_get(keys, other.tokens([1, 3])) == [True, True]
    assert np.array_equal(dst[1], src[2]) and np.array_equal(dst[3], src[0])
    assert np.array_equal(dst[[0, 2]], before[[0, 2]])


@pytest.mark.parametrize(
    "change",
    [{"model": "org/other"}, {"blocks_per_chunk": 2}, {"dtype": torch.float16}, {"layers": 4}],
)
def test_rows_of_another_format_are_a_miss(tmp_path: Path, change: dict[str, object]) -> None:
    _, rows = _rows(0)
    _store(tmp_path, rows).batch_set(["aa"], rows.tokens([0]))
    data = np.zeros((CHUNKS, ROW), dtype=np.int8)
    fields = {k: v for k, v in change.items() if k in FIELDS}
    other = ChunkRows(
        memoryview(data),
        tokens_per_chunk=TOKENS,
        layer_num=int(change.get("layers", 3)),  # type: ignore[call-overload]
        dtype=change.get("dtype", torch.bfloat16),  # type: ignore[arg-type]
        fields={**FIELDS, **fields},
    )
    store = _store(tmp_path, other)
    assert store.batch_exists(["aa"]) == 0
    assert store.batch_get(["aa"], other.tokens([0])) == [False]
    assert not data.any()


def test_corrupt_record_is_a_miss_and_writes_nothing(tmp_path: Path) -> None:
    _, rows = _rows(0)
    first = _store(tmp_path, rows)
    first.batch_set(["aa"], rows.tokens([0]))
    path = first._path("aa")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    data, other = _rows(1)
    before = data.copy()
    assert _store(tmp_path, other).batch_get(["aa"], other.tokens([0])) == [False]
    assert np.array_equal(data, before)


def test_page_addresses_and_buffer() -> None:
    data, rows = _rows(0)
    base = data.ctypes.data
    assert rows.get_page_buffer_meta(rows.tokens([3, 1])) == (
        [base + 3 * ROW, base + ROW],
        [ROW] * 2,
    )
    assert rows.get_contiguous_buf_infos() == ([base], [CHUNKS * ROW], [ROW])
    assert rows.size == CHUNKS * TOKENS and rows.row_bytes == ROW


def test_bad_rows_and_chunk_ids_raise_typed_errors() -> None:
    data = np.zeros((CHUNKS, ROW), dtype=np.int8)
    kw: dict[str, object] = {"tokens_per_chunk": TOKENS, "layer_num": 3, "dtype": torch.bfloat16}
    bad = [
        (bytearray(ROW), ArgumentTypeError),  # not a memoryview
        (memoryview(data).toreadonly(), PoolMismatchError),
        (memoryview(data.reshape(-1)), PoolMismatchError),  # 1-D
        (memoryview(data[:, ::2]), PoolMismatchError),  # rows not contiguous
        (memoryview(data[:0]), PoolMismatchError),  # no row
    ]
    for view, error in bad:
        with pytest.raises(error):
            ChunkRows(view, fields={}, **kw)  # type: ignore[arg-type]
    for name in ("tokens_per_chunk", "layer_num"):
        with pytest.raises(ArgumentTypeError, match=name):
            ChunkRows(memoryview(data), fields={}, **{**kw, name: 0})  # type: ignore[arg-type]
    _, rows = _rows(0)
    with pytest.raises(IndexOutOfRangeError):
        rows.tokens([CHUNKS])
    with pytest.raises(IndexOutOfRangeError):
        rows.tokens([-1])
    with pytest.raises(ArgumentTypeError):
        rows.tokens([0.5])


def test_store_config_is_checked(tmp_path: Path) -> None:
    store, owned = _make_store("file", str(tmp_path), 1 << 20, False, None)
    assert isinstance(store, FilePageStore) and owned
    store.close()
    same, owned = _make_store(store, None, None, False, None)
    assert same is store and not owned
    bad = [
        ("file", None, None, False, None),  # no root_dir
        ("file", str(tmp_path), 0, False, None),  # capacity
        ("file", str(tmp_path), None, "yes", None),  # fsync
        ("mooncake", None, None, False, None),  # no MooncakeConfig fields
        ("s3", None, None, False, None),
    ]
    for args in bad:
        with pytest.raises(ArgumentTypeError):
            _make_store(*args)
