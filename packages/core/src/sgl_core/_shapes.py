"""Shape and byte arithmetic of MLA KV caches (docs/design.md section 5)."""

from __future__ import annotations

import dataclasses

import torch

from sgl_core.errors import ArgumentTypeError, PoolSizeError

__all__ = ["MLAShape", "pages_for_bytes"]


@dataclasses.dataclass(frozen=True)
class MLAShape:
    """The per-token geometry shared by a device pool and its host pool.

    One token of one layer is a row of ``kv_cache_dim`` elements:
    ``kv_lora_rank`` latent values followed by ``qk_rope_head_dim`` rope values,
    unless ``row_dim`` is given: then a row is ``row_dim`` elements of ``dtype``
    whose meaning the engine owns (a *packed* row, e.g. DeepSeek-V3.2's FP8 row
    of 656 ``uint8``: 512 fp8 values, 4 fp32 scales, 64 bf16 rope values).
    A ``row_dim`` equal to the rank split is the plain row (normalized to None).
    """

    layer_num: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: torch.dtype
    row_dim: int | None = None

    def __post_init__(self) -> None:
        for name in ("layer_num", "kv_lora_rank", "qk_rope_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PoolSizeError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise ArgumentTypeError(f"dtype must be a torch.dtype, got {self.dtype!r}")
        row = self.row_dim
        if row is not None:
            if not isinstance(row, int) or isinstance(row, bool) or row <= 0:
                raise PoolSizeError(f"kv_cache_dim must be a positive int or None, got {row!r}")
            if row == self.kv_lora_rank + self.qk_rope_head_dim:
                object.__setattr__(self, "row_dim", None)

    @property
    def packed(self) -> bool:
        """True when rows are ``row_dim`` engine-packed elements, not the rank split."""
        return self.row_dim is not None

    @property
    def kv_cache_dim(self) -> int:
        """Elements in one token row of one layer."""
        if self.row_dim is not None:
            return self.row_dim
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def token_stride_size(self) -> int:
        """Bytes of one token row of one layer (the kernels' ``item_size``)."""
        return self.kv_cache_dim * self.itemsize

    @property
    def layout_dim(self) -> int:
        """Bytes of one token across all layers (page-first token stride)."""
        return self.token_stride_size * self.layer_num

    def bytes_per_page(self, page_size: int) -> int:
        """Bytes of one page across all layers."""
        return self.layout_dim * page_size


def pages_for_bytes(nbytes: float, bytes_per_page: int) -> int:
    """Whole pages that fit in ``nbytes``."""
    return int(nbytes // bytes_per_page)
