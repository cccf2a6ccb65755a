"""vLLM blocks in our FilePageStore with our page records (sgl_core.integrations.vllm.BlockStore).

A block of another dtype, host layout, block size or model is a miss, never a
hit, and a miss leaves the host pool unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sgl_core.errors import ArgumentTypeError, IndexOutOfRangeError
from sgl_core.integrations.vllm import BlockDeviceView, BlockHost, BlockStore
from sgl_core.l3 import FilePageStore

PAGE = 16 * 2 * 2 * 8 * 2  # 16 tokens x K,V x 2 heads x 8 dims, bf16
KEYS = [bytes([i]) * 32 + b"\0\0\0\0" for i in range(3)]


def _host(
    seed: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "page_first",
    page: int = PAGE,
    per: int = 2,
) -> tuple[list[torch.Tensor], BlockHost]:
    g = torch.Generator().manual_seed(seed)
    caches = [torch.randint(-128, 128, (10, page), dtype=torch.int8, generator=g) for _ in range(2)]
    view = BlockDeviceView.of_tensors(caches, [page] * 2, dtype)
    host = BlockHost(view, num_chunks=4, blocks_per_chunk=per, backend="torch", layout=layout)
    return caches, host


def _pages(host: BlockHost) -> list[torch.Tensor]:
    return [host.pool.get_data_page(p).view(torch.uint8) for p in range(host.pool.size)]


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, BlockHost]:
    _, host = _host(0)
    host.store(host.rows([1, 2, 3, 4, 5, 6], [0, 1, 2], [6], [0]))
    store = BlockStore(host, FilePageStore(tmp_path), "org/llama-like")
    assert store.save(KEYS, [0, 1, 2]) == [True] * 6
    return tmp_path, host


def test_same_format_and_model_hits_and_loads_the_bytes(written: tuple[Path, BlockHost]) -> None:
    root, src = written
    caches, host = _host(1)
    store = BlockStore(host, FilePageStore(root), "org/llama-like")
    assert store.stored_prefix(KEYS) == 3
    assert store.fetch(KEYS[:2], [3, 1]) == [True] * 4
    pages = _pages(host)
    ref = _pages(src)
    assert torch.equal(pages[6], ref[0]) and torch.equal(pages[7], ref[1])
    assert torch.equal(pages[2], ref[2]) and torch.equal(pages[3], ref[3])
    # and on into vLLM's blocks
    host.load(host.rows([7, 8], [3], [2], [0]))
    for layer in range(2):
        assert torch.equal(
            caches[layer][[7, 8]], src.view.kv_buffer[layer].view(torch.int8).view(10, -1)[[1, 2]]
        )


MISSES = {
    "another dtype": ({"dtype": torch.float16}, "org/llama-like"),
    "another host layout": ({"layout": "layer_first"}, "org/llama-like"),
    "another block size": ({"page": PAGE // 2}, "org/llama-like"),
    "another chunking": ({"per": 1}, "org/llama-like"),
    "another model": ({}, "org/other-model"),
    "a model name forging a prefix": ({}, "org/llama-like@"),
}


@pytest.mark.parametrize("case", sorted(MISSES))
def test_block_of_another_format_or_model_is_a_miss(
    written: tuple[Path, BlockHost], case: str
) -> None:
    root, _ = written
    kwargs, model = MISSES[case]
    _, host = _host(2, **kwargs)  # type: ignore[arg-type]
    store = BlockStore(host, FilePageStore(root), model)
    before = _pages(host)
    assert store.stored_prefix(KEYS) == 0
    got = store.fetch(KEYS, [0, 1, 2]) if host.blocks_per_chunk == 2 else store.fetch(KEYS[:1], [0])
    assert not any(got)
    assert all(torch.equal(a, b) for a, b in zip(before, _pages(host), strict=True))


def test_bad_arguments_raise_typed_errors(written: tuple[Path, BlockHost]) -> None:
    root, _ = written
    _, host = _host(3)
    with pytest.raises(ArgumentTypeError):
        BlockStore(host, FilePageStore(root), "")
    store = BlockStore(host, FilePageStore(root), "org/llama-like")
    with pytest.raises(ArgumentTypeError):
        store.keys(["not-bytes"])  # type: ignore[list-item]
    before = _pages(host)
    with pytest.raises(IndexOutOfRangeError):
        store.fetch(KEYS[:1], [4])
    assert all(torch.equal(a, b) for a, b in zip(before, _pages(host), strict=True))
