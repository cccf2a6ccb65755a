"""What ``sgl-bench hicache`` measures: model shapes, the run's configuration and its cases.

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

__all__ = [
    "MODELS",
    "Case",
    "HicacheConfig",
    "ModelShape",
    "create_device_pool",
    "list_cases",
    "pairs_of",
]


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


def create_device_pool(backend: Backend, cfg: HicacheConfig, *, size: int, page_size: int) -> Any:
    """A device pool of the model's kind (MLA dims may be overridden by hidden options).

    Typed ``Any``: the bench drives pools of either kind through the same calls.
    """
    shape = cfg.shape
    common: dict[str, Any] = {"size": size, "page_size": page_size, "dtype": shape.dtype}
    common.update(layer_num=cfg.layers, device=cfg.device)
    if shape.is_mha:
        return backend.create_mha_device_pool(
            **common, head_num=shape.head_num, head_dim=shape.head_dim
        )
    return backend.create_device_pool(
        **common,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        kv_cache_dim=shape.kv_cache_dim,
        index_head_dim=shape.index_head_dim,
        with_index_k_scale=shape.with_index_k_scale,
    )


@dataclasses.dataclass(frozen=True)
class HicacheConfig:
    """Model shape and run size (defaults: DeepSeek-V3 MLA cache in bf16)."""

    layers: int = 61
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    tokens: int = 4096  # tokens moved per call, unless ``pages`` is given
    pages: int | None = None  # pages moved per call
    warmup: int = 1
    repeats: int = 5
    budget_s: float = 4.0  # per op: slow baselines stop repeating after this
    baselines: tuple[str, ...] = ("per_token", "per_page")
    shuffle_host: bool = False  # random host pages instead of host.alloc() slots
    seed: int = 0
    device: str | None = None
    model: str = (
        "deepseek-v3"  # a key of MODELS (dtype, packed rows, indexer); MHA ignores MLA dims
    )
    compare_fixed: bool = False  # also time "fixed": the old preset (ATen's threads), interleaved
    copy_threads: tuple[int, ...] = (1,)  # the reference: the fastest of these torch thread counts

    @property
    def shape(self) -> ModelShape:
        return MODELS[self.model]

    @property
    def row_bytes(self) -> int:
        """Bytes of one token over every layer (MLA row or K and V, indexer included)."""
        shape = self.shape
        itemsize = torch.empty((), dtype=shape.dtype).element_size()
        if shape.is_mha:
            return self.layers * 2 * shape.head_num * shape.head_dim * itemsize
        dim = shape.kv_cache_dim or self.kv_lora_rank + self.qk_rope_head_dim
        index = (shape.index_head_dim or 0) * itemsize + (4 if shape.with_index_k_scale else 0)
        return self.layers * (dim * itemsize + index)

    def batch_tokens(self, page_size: int) -> int:
        if self.pages is not None:
            return self.pages * page_size
        return max(page_size, self.tokens // page_size * page_size)


@dataclasses.dataclass(frozen=True)
class Case:
    backend: Backend
    layout: HostLayout
    io_backend: IOBackend
    page_size: int

    @property
    def label(self) -> str:
        return (
            f"{self.backend.name} {self.layout.value}/{self.io_backend.value} page {self.page_size}"
        )


def list_cases(
    backends: list[Backend],
    layouts: set[HostLayout] | None,
    page_sizes: list[int],
    mha: bool = False,
) -> list[Case]:
    cases: list[Case] = []
    for backend in backends:
        for page_size in page_sizes:
            for layout, ios in pairs_of(backend, mha).items():
                if layouts is not None and layout not in layouts:
                    continue
                cases.extend(
                    Case(backend, layout, io, page_size)
                    for io in sorted(ios, key=lambda i: i.value)
                )
    return cases
