"""SGLang's NPU device pools (built on CPU) under the ascend backend's host pools.

``NPUMLATokenToKVPool`` / ``NPUMHATokenToKVPool`` construct on CPU (the MLA
pool reads the DCP width from SGLang's runtime context, stated here for one
rank). ``create_host_pool`` sees them through views of their own tensors, and
the host pools' transfers (through ``wrap_host_pool``, as SGLang's controller
calls them) move the engine's own bytes. No NPU: the ascend backend runs on
CPU tensors.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.errors import IndexOutOfRangeError, PoolMismatchError
from sgl_core.integrations.sglang import wrap_host_pool

from sglang.srt.hardware_backend.npu.memory_pool_npu import NPUMHATokenToKVPool, NPUMLATokenToKVPool  # isort: skip
from sglang.srt.runtime_context import get_parallel  # isort: skip

PAGE, LAYERS = 4, 2
ONE_RANK = {"attn_dcp_size": 1, "attn_dcp_rank": 0, "tp_rank": 0, "tp_size": 1}


def _npu(kind: str, seed: int) -> Any:
    if kind == "mla":
        with get_parallel().override(**ONE_RANK):
            pool: Any = NPUMLATokenToKVPool(
                size=32, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=8,
                qk_rope_head_dim=4, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
            )  # fmt: skip
    else:
        pool = NPUMHATokenToKVPool(
            size=32, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8,
            layer_num=LAYERS, device="cpu", enable_memory_saver=False,
        )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for buf in (pool.k_buffer, pool.v_buffer):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))
    return pool


def _rows(pool: Any, idx: torch.Tensor) -> list[torch.Tensor]:
    """Per layer and component, the engine's rows of tokens ``idx`` (page, offset)."""
    return [
        buf[layer].flatten(0, 1)[idx].clone()
        for buf in (pool.k_buffer, pool.v_buffer)
        for layer in range(LAYERS)
    ]


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_npu_pool_round_trip(kind: str) -> None:
    src, dst = _npu(kind, seed=1), _npu(kind, seed=2)
    host = wrap_host_pool(
        sgl_core.get_backend("ascend").create_host_pool(src, layout="page_first_kv_split")
    )
    dev_idx = torch.arange(8, 16)
    h_idx = host.alloc(8)
    assert h_idx is not None
    host.backup_from_device_all_layer(src, h_idx, dev_idx, "kernel_ascend")
    bad = torch.tensor([16, 17, 18, 10**6])
    before = [t.clone() for t in (dst.k_buffer, dst.v_buffer)]
    with pytest.raises(IndexOutOfRangeError):
        host.load_to_device_per_layer(dst, h_idx[:4], bad, 0, "kernel_ascend")
    assert all(torch.equal(a, b) for a, b in zip(before, (dst.k_buffer, dst.v_buffer), strict=True))
    out = torch.arange(20, 28)
    for layer in range(LAYERS):
        host.load_to_device_per_layer(dst, h_idx, out, layer, "kernel_ascend")
    # the engine's own tensors were read and written (views share them)
    assert all(torch.equal(a, b) for a, b in zip(_rows(dst, out), _rows(src, dev_idx), strict=True))


def test_npu_pool_views_refuse_what_they_cannot_mirror() -> None:
    pool = _npu("mha", seed=3)
    pool.k_buffer = pool.k_buffer.to(torch.float16)  # stored dtype is not the pool's
    with pytest.raises(PoolMismatchError):
        sgl_core.get_backend("ascend").create_host_pool(pool, layout="page_first_kv_split")
    mla = _npu("mla", seed=4)
    mla.index_k_buffer = torch.zeros(1)  # an indexer cache: not mirrored
    with pytest.raises(PoolMismatchError):
        sgl_core.get_backend("ascend").create_host_pool(mla, layout="page_first_kv_split")
