"""vLLM's canonical KV blocks through the cuda backend's host pool and movers
(sgl_core.integrations.vllm.BlockHost; Triton's interpreter on CPU tensors)."""

from __future__ import annotations

import pytest
import torch

from sgl_core.errors import IndexOutOfRangeError
from sgl_core.integrations.vllm import BlockDeviceView, BlockHost

PAIRS = [
    ("page_first", "kernel"),
    ("layer_first", "kernel"),
    ("layer_first", "direct"),
    ("page_first_direct", "direct"),
]


@pytest.mark.parametrize(("layout", "io"), PAIRS)
def test_cuda_movers_store_and_load_vllm_blocks(layout: str, io: str) -> None:
    g = torch.Generator().manual_seed(0)
    caches = [torch.randint(-128, 128, (10, 512), dtype=torch.int8, generator=g) for _ in range(2)]
    ref = [c.clone() for c in caches]
    view = BlockDeviceView.of_tensors(caches, [512] * 2, torch.bfloat16)
    host = BlockHost(
        view, num_chunks=2, blocks_per_chunk=2, backend="cuda", layout=layout, io_backend=io
    )
    assert type(host.pool).__module__.startswith("sgl_cuda")
    host.store(host.rows([1, 2, 3], [0, 1], [3], [0]))
    for c in caches:
        c[[7, 8, 9]] = 0
    with pytest.raises(IndexOutOfRangeError):  # refused before any byte moves
        host.load(host.rows([7, 8, 10], [0, 1], [3], [0]))
    assert all(not c[[7, 8, 9]].any() for c in caches)
    host.load(host.rows([7, 8, 9], [0, 1], [3], [0]))
    for c, r in zip(caches, ref, strict=True):
        assert torch.equal(c[[7, 8, 9]], r[[1, 2, 3]])
        assert torch.equal(c[:7], r[:7])
