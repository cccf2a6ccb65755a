"""vLLM's canonical KV blocks through our host pool (sgl_core.integrations.vllm, no vLLM).

The tests against vLLM's own connector are in tests/with_vllm; these pin the
block arithmetic and the checks, with the torch backend on CPU.
"""

from __future__ import annotations

import pytest
import torch

from sgl_core.errors import (
    ArgumentTypeError,
    DuplicateIndexError,
    IndexOutOfRangeError,
    IndexShapeError,
    PoolMismatchError,
    SGLError,
    UnsupportedLayoutError,
)
from sgl_core.integrations.vllm import BlockDeviceView, BlockHost, kv_dtype

# (page bytes, dtype): a GQA block (16 tokens x 2 KV x 2 heads x 8 dims, bf16)
# and an MLA block (16 tokens x 72 latent dims, fp8)
KINDS = {
    "gqa": (16 * 2 * 2 * 8 * 2, torch.bfloat16),
    "mla": (16 * 72, torch.float8_e4m3fn),
}


def _caches(page: int, layers: int = 3, blocks: int = 10, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(-128, 128, (blocks, page), dtype=torch.int8, generator=g)
        for _ in range(layers)
    ]


def _host(caches: list[torch.Tensor], dtype: torch.dtype, **kw: int) -> BlockHost:
    view = BlockDeviceView.of_tensors(caches, [c.shape[1] for c in caches], dtype)
    return BlockHost(
        view,
        num_chunks=kw.get("num_chunks", 4),
        blocks_per_chunk=kw.get("blocks_per_chunk", 1),
        backend="torch",
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("per", [1, 2])
def test_store_then_load_moves_every_byte_of_the_blocks(kind: str, per: int) -> None:
    page, dtype = KINDS[kind]
    caches = _caches(page)
    before = [c.clone() for c in caches]
    host = _host(caches, dtype, blocks_per_chunk=per)
    # three blocks of one request starting at logical block 1: with two blocks
    # per chunk the first chunk's sub-block 0 is skipped
    rows = host.rows([3, 7, 2], [1, 3] if per == 2 else [0, 2, 3], [3], [1])
    host.store(rows)
    for c in caches:
        c[[4, 5, 9]] = 0
    back = host.rows([4, 9, 5], [1, 3] if per == 2 else [0, 2, 3], [3], [1])
    host.load(back)
    for layer, (c, ref) in enumerate(zip(caches, before, strict=True)):
        assert torch.equal(c[[4, 9, 5]], ref[[3, 7, 2]]), layer
        untouched = [b for b in range(10) if b not in (4, 5, 9)]
        assert torch.equal(c[untouched], ref[untouched])


def test_host_pages_follow_chunk_and_skip_arithmetic() -> None:
    page, dtype = KINDS["gqa"]
    host = _host(_caches(page), dtype, blocks_per_chunk=4)
    rows = host.rows([1, 2, 3, 4, 5], [2, 0], [5], [6])
    # logical block 6 is sub-block 2 of its chunk: chunk 2 pages 10, 11, chunk 0 pages 0..2
    assert rows.host.tolist() == [10, 11, 0, 1, 2]
    assert rows.device.tolist() == [1, 2, 3, 4, 5]
    assert rows.num_bytes == 5 * 3 * page


def _snapshot(caches: list[torch.Tensor], host: BlockHost) -> list[torch.Tensor]:
    """Every KV-cache byte and every host page."""
    # as bytes: random fp8 bytes hold NaNs, which torch.equal never calls equal
    pages = [host.pool.get_data_page(p).view(torch.uint8) for p in range(host.pool.size)]
    return [c.clone() for c in caches] + pages


BAD_CALLS = {
    "null block": (([0, 2], [0, 1], [2], [0]), IndexOutOfRangeError),
    "block past the end": (([1, 10], [0, 1], [2], [0]), IndexOutOfRangeError),
    "chunk past the end": (([1, 2], [0, 4], [2], [0]), IndexOutOfRangeError),
    "negative chunk": (([1, 2], [-1, 0], [2], [0]), IndexOutOfRangeError),
    "group size short": (([1, 2], [0, 1], [1], [0]), IndexShapeError),
    "too few chunks": (([1, 2], [0], [2], [0]), IndexShapeError),
    "too many chunks": (([1, 2], [0, 1, 2], [2], [0]), IndexShapeError),
    "two groups": (([1, 2], [0, 1], [1, 1], [0, 0]), UnsupportedLayoutError),
    "negative block index": (([1, 2], [0, 1], [2], [-1]), IndexShapeError),
    "2-D block ids": (([[1, 2]], [0, 1], [2], [0]), IndexShapeError),
    "float block ids": (([1.0, 2.0], [0, 1], [2], [0]), ArgumentTypeError),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
@pytest.mark.parametrize("direction", ["store", "load"])
def test_bad_specs_are_refused_before_any_byte_moves(case: str, direction: str) -> None:
    page, dtype = KINDS["mla"]
    caches = _caches(page)
    host = _host(caches, dtype)
    host.store(host.rows([5, 6, 7, 8], [0, 1, 2, 3], [4], [0]))
    before = _snapshot(caches, host)
    args, error = BAD_CALLS[case]
    with pytest.raises(error):
        rows = host.rows(*args)
        host.store(rows) if direction == "store" else host.load(rows)
    after = _snapshot(caches, host)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_duplicate_destination_block_is_refused_by_the_pool_unchanged() -> None:
    page, dtype = KINDS["gqa"]
    caches = _caches(page)
    host = _host(caches, dtype)
    host.store(host.rows([1, 2], [0, 1], [2], [0]))
    before = _snapshot(caches, host)
    with pytest.raises(DuplicateIndexError):
        host.load(host.rows([3, 3], [0, 1], [2], [0]))
    with pytest.raises(DuplicateIndexError):
        host.store(host.rows([1, 2], [2, 2], [2], [0]))
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(caches, host), strict=True))


def test_view_shares_vllm_memory_and_rejects_layouts_it_cannot_move() -> None:
    page, dtype = KINDS["gqa"]
    caches = _caches(page)
    view = BlockDeviceView.of_tensors(caches, [page] * 3, dtype)
    assert view.kv_buffer[1].data_ptr() == caches[1].data_ptr()
    assert (view.size, view.page_size, view.layer_num) == (9, 1, 3)
    assert view.kv_cache_dim * dtype.itemsize == page
    cases: list[tuple[list[torch.Tensor], list[int], type[SGLError]]] = [
        ([], [], PoolMismatchError),
        (caches, [page] * 2, PoolMismatchError),
        ([caches[0], _caches(page // 2, 1)[0]], [page, page // 2], UnsupportedLayoutError),
        ([caches[0], caches[1][:, : page // 2]], [page, page // 2], UnsupportedLayoutError),
        ([caches[0][:, :page].t().contiguous().t()[:, :page]], [page], UnsupportedLayoutError),
        ([caches[0].view(torch.bfloat16)], [page], PoolMismatchError),
        ([caches[0][:1]], [page], PoolMismatchError),
        ([caches[0][:, :6]], [6], UnsupportedLayoutError),
    ]
    for tensors, pages, error in cases:
        with pytest.raises(error):
            BlockDeviceView.of_tensors(tensors, pages, dtype)


def test_kv_dtype_names() -> None:
    assert kv_dtype("bfloat16") is torch.bfloat16
    assert kv_dtype("torch.float16") is torch.float16
    assert kv_dtype("fp8_e5m2") is torch.float8_e5m2
    with pytest.raises(UnsupportedLayoutError):
        kv_dtype("int4")
    with pytest.raises(ArgumentTypeError):
        kv_dtype(16)  # type: ignore[arg-type]


def test_host_sizes_are_checked() -> None:
    page, dtype = KINDS["gqa"]
    view = BlockDeviceView.of_tensors(_caches(page), [page] * 3, dtype)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ArgumentTypeError):
            BlockHost(view, num_chunks=bad, blocks_per_chunk=1, backend="torch")  # type: ignore[arg-type]
    host = BlockHost(view, num_chunks=3, blocks_per_chunk=5, backend="torch")
    assert host.pool.size >= 15
