"""The engine-visible shape objects of both kinds, sized by their KV spec (``_kv_spec``).

``MLAShape`` and ``MHAShape`` are what ``pool.shape`` reports: the kind's own
numbers, checked on construction by building their spec (``spec``), whose
byte sizes they report, so a pool's sizes have one source.
"""

from __future__ import annotations

import dataclasses

import torch

from sgl_core.kv._spec import KVSpec, mha_spec, mla_spec

__all__ = ["MHADims", "MHAShape", "MLAShape"]


class _Sized:
    """Byte sizes read off ``spec`` (every layer and component of one token)."""

    _spec: KVSpec  # set once by each shape's __post_init__

    @property
    def spec(self) -> KVSpec:
        """The shape's rows as components (an MLA pool's own spec adds its indexer's)."""
        return self._spec

    @property
    def itemsize(self) -> int:
        return self.spec.components[0].itemsize

    @property
    def token_stride_size(self) -> int:
        """Bytes of one token of one layer, every component (the kernels' ``item_size``)."""
        return sum(c.row_bytes for c in self.spec.components)

    @property
    def layout_dim(self) -> int:
        """Bytes of one token across all layers (page-first token stride)."""
        return self.spec.token_bytes

    def bytes_per_page(self, page_size: int) -> int:
        """Bytes of one page across all layers."""
        return self.spec.bytes_per_page(page_size)


@dataclasses.dataclass(frozen=True)
class MLAShape(_Sized):
    """The per-token geometry shared by an MLA device pool and its host pool.

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
        # The spec checks every number and the dtype (typed errors naming the field).
        spec = mla_spec(
            self.layer_num, self.kv_lora_rank, self.qk_rope_head_dim, self.dtype, self.row_dim
        )
        if self.row_dim == self.kv_lora_rank + self.qk_rope_head_dim:
            object.__setattr__(self, "row_dim", None)
        object.__setattr__(self, "_spec", spec)

    @property
    def packed(self) -> bool:
        """True when rows are ``row_dim`` engine-packed elements, not the rank split."""
        return self.row_dim is not None

    @property
    def kv_cache_dim(self) -> int:
        """Elements in one token row of one layer."""
        return self.spec.component("kv").dim


@dataclasses.dataclass(frozen=True)
class MHAShape(_Sized):
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
        spec = mha_spec(self.layer_num, self.head_num, self.head_dim, self.v_head_dim, self.dtype)
        object.__setattr__(self, "_spec", spec)

    @property
    def k_row_bytes(self) -> int:
        """Bytes of one token's K row of one layer."""
        return self.spec.component("k").row_bytes

    @property
    def v_row_bytes(self) -> int:
        """Bytes of one token's V row of one layer."""
        return self.spec.component("v").row_bytes


class MHADims:
    """The MHA numbers of a pool (device or host), read off its ``shape``."""

    shape: MHAShape

    @property
    def head_num(self) -> int:
        return self.shape.head_num

    @property
    def head_dim(self) -> int:
        return self.shape.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.shape.v_head_dim
