"""Shape and byte arithmetic of MHA/GQA KV caches (docs/design.md section 5b)."""

from __future__ import annotations

import dataclasses

import torch

from sgl_core.errors import ArgumentTypeError, PoolSizeError

__all__ = ["MHAShape"]


@dataclasses.dataclass(frozen=True)
class MHAShape:
    """The per-token geometry shared by an MHA device pool and its host pool.

    One token of one layer is a K row of ``head_num * head_dim`` elements and
    a V row of ``head_num * v_head_dim`` elements (GQA: ``head_num`` is the
    number of KV heads held on this rank).
    """

    layer_num: int
    head_num: int
    head_dim: int
    v_head_dim: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("layer_num", "head_num", "head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PoolSizeError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise ArgumentTypeError(f"dtype must be a torch.dtype, got {self.dtype!r}")

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def k_row_bytes(self) -> int:
        """Bytes of one token's K row of one layer."""
        return self.head_num * self.head_dim * self.itemsize

    @property
    def v_row_bytes(self) -> int:
        """Bytes of one token's V row of one layer."""
        return self.head_num * self.v_head_dim * self.itemsize

    @property
    def token_stride_size(self) -> int:
        """Bytes of one token of one layer, K and V."""
        return self.k_row_bytes + self.v_row_bytes

    @property
    def layout_dim(self) -> int:
        """Bytes of one token across all layers, K and V."""
        return self.token_stride_size * self.layer_num

    def bytes_per_page(self, page_size: int) -> int:
        """Bytes of one page across all layers, K and V."""
        return self.layout_dim * page_size
