"""The KV model: a pool's rows as a list of named components (docs/design.md section 5).

Pools and movers read the components, never the kind. ``MLAShape`` and
``MHAShape`` (``pool.shape``) are checked by building their spec.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

import torch

from sgl_core.errors import ArgumentTypeError, LayerIndexError, PoolSizeError

__all__ = [
    "Component",
    "KVKind",
    "KVSpec",
    "MHADims",
    "MHAShape",
    "MLAShape",
    "mha_spec",
    "mla_spec",
    "positive_int",
]


class KVKind(str, enum.Enum):
    """What a pool's ``kv`` rows mean: one MLA latent row, or MHA/GQA K and V rows."""

    MLA = "mla"
    MHA = "mha"


def positive_int(name: str, value: object) -> int:
    """``value`` when it is a positive int (not ``bool``), else ``PoolSizeError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PoolSizeError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Component:
    """One row a token keeps per layer: ``heads x dim`` elements of ``dtype``.

    ``layers`` are the model layers that keep the row, in the order a
    buffer stores them (the row's *slot*); None: every layer, slot = layer.
    ``device_name`` is the device pool attribute that lists the row's
    per-layer (or per-slot) tensors, each ``(slots, heads, dim)``.
    """

    name: str
    dim: int
    dtype: torch.dtype
    heads: int = 1
    layers: tuple[int, ...] | None = None
    device_name: str = ""

    def __post_init__(self) -> None:
        positive_int(f"{self.name} dim", self.dim)
        positive_int(f"{self.name} heads", self.heads)
        if not isinstance(self.dtype, torch.dtype):
            raise ArgumentTypeError(f"dtype must be a torch.dtype, got {self.dtype!r}")
        if not self.device_name:
            object.__setattr__(self, "device_name", f"{self.name}_buffer")

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def elements(self) -> int:
        """Elements of one row (every head)."""
        return self.heads * self.dim

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's row of one layer."""
        return self.elements * self.itemsize

    def rows(self, layer_num: int) -> int:
        """Rows a token keeps of this component (one per layer that has it)."""
        return layer_num if self.layers is None else len(self.layers)

    def slot(self, layer_id: int) -> int | None:
        """The buffer row of model layer ``layer_id``; None when the layer has none."""
        if self.layers is None:
            return layer_id
        try:
            return self.layers.index(layer_id)
        except ValueError:
            return None


@dataclasses.dataclass(frozen=True)
class KVSpec:
    """The components of one KV pool, and what identifies its page format.

    ``identity`` lists the kind's own numbers (MLA: ranks and row width; MHA:
    heads and head dims) in the order a device pool is checked against them.
    ``stacked`` names components a host pool keeps in one ``(n, ...)``
    allocation, ``kv_buffer``, when their shapes agree (MHA's K and V, as
    SGLang does), so ``get_data_page(flat=False)`` stacks them.
    """

    kind: KVKind
    layer_num: int
    dtype: torch.dtype
    components: tuple[Component, ...]
    identity: tuple[tuple[str, int], ...]
    stacked: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        positive_int("layer_num", self.layer_num)
        if not self.components:
            raise PoolSizeError("a KV spec needs at least one component")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise PoolSizeError(f"component names must be unique, got {names}")

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(c.name == name for c in self.components)

    @property
    def token_bytes(self) -> int:
        """Bytes of one token across every layer and component."""
        return sum(c.rows(self.layer_num) * c.row_bytes for c in self.components)

    def bytes_per_page(self, page_size: int) -> int:
        return self.token_bytes * page_size

    @property
    def flat_page_dtype(self) -> torch.dtype:
        """The dtype of a flat page: the components' one dtype, else ``torch.uint8`` bytes."""
        dtypes = {c.dtype for c in self.components}
        return self.dtype if dtypes == {self.dtype} else torch.uint8

    def value(self, name: str) -> int:
        return dict(self.identity)[name]


def mla_spec(
    layer_num: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    dtype: torch.dtype,
    row_dim: int | None = None,
    *,
    index_head_dim: int | None = None,
    indexer_layer_ids: Iterable[int] = (),
    with_index_k_scale: bool = False,
) -> KVSpec:
    """MLA rows: one ``kv`` row per layer; with ``index_head_dim``, the DSA indexer rows."""
    rank = positive_int("kv_lora_rank", kv_lora_rank)
    rope = positive_int("qk_rope_head_dim", qk_rope_head_dim)
    width = rank + rope if row_dim is None else positive_int("kv_cache_dim", row_dim)
    comps: tuple[Component, ...] = (Component("kv", width, dtype),)
    if index_head_dim is not None:
        ids = tuple(indexer_layer_ids)
        for layer in ids:
            if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < layer_num:
                raise LayerIndexError(f"indexer layer {layer!r} is not in [0, {layer_num})")
        comps += (Component("index_k", index_head_dim, dtype, layers=ids),)
        if with_index_k_scale:
            comps += (Component("index_k_scale", 1, torch.float32, layers=ids),)
    identity = (("kv_lora_rank", rank), ("qk_rope_head_dim", rope), ("kv_cache_dim", width))
    return KVSpec(KVKind.MLA, layer_num, dtype, comps, identity)


def mha_spec(
    layer_num: int, head_num: int, head_dim: int, v_head_dim: int, dtype: torch.dtype
) -> KVSpec:
    """MHA/GQA rows: a ``k`` row and a ``v`` row per layer, ``head_num`` heads each."""
    heads = positive_int("head_num", head_num)
    k = Component("k", positive_int("head_dim", head_dim), dtype, heads=heads)
    v = Component("v", positive_int("v_head_dim", v_head_dim), dtype, heads=heads)
    identity = (("head_num", heads), ("head_dim", head_dim), ("v_head_dim", v_head_dim))
    return KVSpec(KVKind.MHA, layer_num, dtype, (k, v), identity, stacked=("k", "v"))


class _Sized:
    """Byte sizes read off ``spec`` (docs/design.md section 5a)."""

    _spec: KVSpec  # set once by each shape's __post_init__

    @property
    def spec(self) -> KVSpec:
        """The shape's rows (an MLA pool's own spec adds its indexer's)."""
        return self._spec

    @property
    def itemsize(self) -> int:
        return self.spec.components[0].itemsize

    @property
    def token_stride_size(self) -> int:
        return sum(c.row_bytes for c in self.spec.components)

    @property
    def layout_dim(self) -> int:
        return self.spec.token_bytes

    def bytes_per_page(self, page_size: int) -> int:
        return self.spec.bytes_per_page(page_size)


@dataclasses.dataclass(frozen=True)
class MLAShape(_Sized):
    """The per-token geometry of an MLA device pool and its host pool (docs/design.md
    section 5a; ``row_dim``: packed rows, normalized to None when it is the rank split)."""

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
        return self.row_dim is not None

    @property
    def kv_cache_dim(self) -> int:
        return self.spec.component("kv").dim


@dataclasses.dataclass(frozen=True)
class MHAShape(_Sized):
    """The per-token geometry of an MHA device pool and its host pool (docs/design.md
    section 5b; GQA: ``head_num`` is the number of KV heads held on this rank)."""

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
        return self.spec.component("k").row_bytes

    @property
    def v_row_bytes(self) -> int:
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
