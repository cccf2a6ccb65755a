"""Model shapes ``sgl-bench hicache --model`` measures: the MLA default and MHA/GQA models.

An MLA model is ``(layers, kv_lora_rank, qk_rope_head_dim)``; an MHA model
``(layers, KV heads, head_dim)`` with V as wide as K. The numbers are each
model's KV cache per tensor-parallel rank of 1 (all KV heads on one device).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.protocols._protocols import Backend

__all__ = ["MODELS", "ModelShape", "create_device_pool", "pairs_of"]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    kv_lora_rank: int = 0  # MLA
    qk_rope_head_dim: int = 0  # MLA
    head_num: int = 0  # MHA: KV heads
    head_dim: int = 0  # MHA
    dtype: torch.dtype = torch.bfloat16
    kv_cache_dim: int | None = None  # MLA packed rows of ``dtype``
    index_head_dim: int | None = None  # the DSA indexer cache, on every layer
    with_index_k_scale: bool = False

    @property
    def is_mha(self) -> bool:
        return self.head_num > 0


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("deepseek-v3", 61, kv_lora_rank=512, qk_rope_head_dim=64),
        # FP8 MLA rows (512 fp8 + 4 fp32 scales + 64 bf16 rope = 656 bytes) and the DSA
        # indexer cache (128 fp8 bytes + an fp32 scale per token) on every layer.
        ModelShape(
            "deepseek-v32",
            61,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            dtype=torch.uint8,
            kv_cache_dim=656,
            index_head_dim=128,
            with_index_k_scale=True,
        ),
        ModelShape("llama3-70b", 80, head_num=8, head_dim=128),
        ModelShape("qwen3-235b", 94, head_num=4, head_dim=128),
    )
}


def pairs_of(backend: Backend, mha: bool) -> dict[HostLayout, frozenset[IOBackend]]:
    """The (layout, io) pairs a backend builds for the model's pool kind."""
    return dict(backend.supported_mha_pairs if mha else backend.supported_pairs)


def create_device_pool(
    backend: Backend,
    shape: ModelShape,
    *,
    size: int,
    page_size: int,
    dtype: torch.dtype,
    layers: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    device: str | None,
    kv_cache_dim: int | None = None,
    index_head_dim: int | None = None,
    with_index_k_scale: bool = False,
) -> Any:
    """A device pool of the model's kind (MLA dims may be overridden by hidden options).

    Typed ``Any``: the bench drives pools of either kind through the same calls.
    """
    if shape.is_mha:
        return backend.create_mha_device_pool(
            size=size,
            page_size=page_size,
            dtype=dtype,
            head_num=shape.head_num,
            head_dim=shape.head_dim,
            layer_num=layers,
            device=device,
        )
    return backend.create_device_pool(
        size=size,
        page_size=page_size,
        dtype=dtype,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        layer_num=layers,
        device=device,
        kv_cache_dim=kv_cache_dim,
        index_head_dim=index_head_dim,
        with_index_k_scale=with_index_k_scale,
    )
