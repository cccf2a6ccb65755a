"""What ``sgl-bench hicache`` measures: the run's configuration and its cases."""

from __future__ import annotations

import dataclasses

import torch

from sgl_core.cli._hicache_models import MODELS, pairs_of
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.protocols._protocols import Backend

__all__ = ["Case", "HicacheConfig", "list_cases"]


@dataclasses.dataclass(frozen=True)
class HicacheConfig:
    """Model shape and run size (defaults: DeepSeek-V3 MLA cache in bf16)."""

    layers: int = 61
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    dtype: torch.dtype = torch.bfloat16
    tokens: int = 4096  # tokens moved per call, unless ``pages`` is given
    pages: int | None = None  # pages moved per call
    warmup: int = 1
    repeats: int = 5
    budget_s: float = 4.0  # per op: slow baselines stop repeating after this
    baselines: tuple[str, ...] = ("per_token", "per_page")
    shuffle_host: bool = False  # random host pages instead of host.alloc() slots
    seed: int = 0
    device: str | None = None
    model: str = "deepseek-v3"  # a key of MODELS; MHA models ignore the MLA dims above
    kv_cache_dim: int | None = None  # packed rows of ``dtype`` (DeepSeek-V3.2: 656 uint8)
    index_head_dim: int | None = None  # the DSA indexer cache, on every layer
    with_index_k_scale: bool = False
    compare_fixed: bool = False  # also time "fixed": the old preset (ATen's threads), interleaved
    copy_threads: tuple[int, ...] = (1,)  # the reference: the fastest of these torch thread counts

    @property
    def is_mha(self) -> bool:
        return MODELS[self.model].is_mha

    @property
    def row_bytes(self) -> int:
        """Bytes of one token over every layer (MLA row or K and V, indexer included)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        shape = MODELS[self.model]
        if shape.is_mha:
            return self.layers * 2 * shape.head_num * shape.head_dim * itemsize
        dim = self.kv_cache_dim or self.kv_lora_rank + self.qk_rope_head_dim
        index = (self.index_head_dim or 0) * itemsize + (4 if self.with_index_k_scale else 0)
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
