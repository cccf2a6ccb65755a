"""Real vLLM 0.33 objects for the tests: configs, KV caches, canonical views.

Everything here is vLLM's own class, built as vLLM builds it, except the two
stand-ins named in docs/vllm.md: no ``VllmConfig`` (it needs a model's HF
config; ``OffloadingConfig`` is built directly, with the fields
``build_offloading_config`` would fill) and no ``register_kv_caches`` (it
derives canonical mappings from the ``VllmConfig``; the ``CanonicalKVCaches``
are built as its direct-layout branch builds them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    FullAttentionSpec,
    MLAAttentionSpec,
    compute_layer_kv_cache_shape_bytes,
)
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

BLOCK = 16
NUM_BLOCKS = 12
LAYERS = 3


def kv_spec(kind: str, dtype: torch.dtype = torch.bfloat16) -> AttentionSpec:
    """A Llama-like GQA layer (2 KV heads of 8) or a DeepSeek-like MLA layer (64 + 8)."""
    if kind == "llama":
        return FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=dtype)
    return MLAAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=72, dtype=dtype, cache_dtype_str="auto"
    )


def offloading_config(
    kind: str,
    *,
    spec_name: str = "SglOffloadingSpec",
    blocks_per_chunk: int = 1,
    chunks: int = 4,
    model: str = "test/llama-like",
    dtype: str = "bfloat16",
    extra: dict[str, Any] | None = None,
) -> OffloadingConfig:
    spec = kv_spec(kind)
    names = tuple(f"model.layers.{i}.attn" for i in range(LAYERS))
    per_block = LAYERS * spec.page_size_bytes
    extra_config: dict[str, Any] = {
        "spec_name": spec_name,
        "cpu_bytes_to_use": chunks * blocks_per_chunk * per_block,
        "sgl_backend": "torch",
    }
    if spec_name == "SglOffloadingSpec":
        extra_config["spec_module_path"] = "sgl_core.integrations.vllm"
    extra_config.update(extra or {})
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=BLOCK, layer_names=names, group_id=0),),
        worker_kv_bytes_per_block=per_block,
        enable_kv_cache_events=False,
        extra_config=extra_config,
        engine_id="engine-0",
        model=OffloadingModelConfig(name=model, dtype=dtype, max_model_len=1024),
        cache=OffloadingCacheConfig(tokens_per_hash=BLOCK, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


@dataclass
class Caches:
    layers: list[torch.Tensor]  # vLLM's per-layer KV caches, (B, H, N, C bytes) int8
    canonical: CanonicalKVCaches

    def block_bytes(self) -> list[torch.Tensor]:
        """Every layer's blocks as (num_blocks, page) bytes (a copy)."""
        return [t.tensor.view(torch.uint8).clone() for t in self.canonical.tensors]


def kv_caches(kind: str, seed: int = 0) -> Caches:
    """Random KV caches of vLLM's logical page shape, and their canonical view
    as ``OffloadingConnectorWorker.register_kv_caches`` builds it (direct layout)."""
    spec = kv_spec(kind)
    shape = compute_layer_kv_cache_shape_bytes(spec, NUM_BLOCKS)
    g = torch.Generator().manual_seed(seed)
    layers = [torch.randint(-128, 128, shape, dtype=torch.int8, generator=g) for _ in range(LAYERS)]
    page = spec.page_size_bytes
    tensors, refs = [], []
    for i, layer in enumerate(layers):
        view = torch.tensor([], dtype=torch.int8).set_(
            layer.untyped_storage(), 0, (NUM_BLOCKS, page), (layer.stride(0), 1)
        )
        tensors.append(CanonicalKVCacheTensor(tensor=view, page_size_bytes=page))
        refs.append(
            CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=spec.unpadded_page_size_bytes)
        )
    return Caches(layers, CanonicalKVCaches(tensors=tensors, group_data_refs=[refs]))
