"""The Ascend device pools' kinds (components and engine accessors), and :func:`engine_view`.

Shapes: docs/design.md, device pools. :func:`engine_view` sees SGLang
0.5.23's NPU pools as a pool of their kind whose buffers *are* the engine's
tensors, cached per pool so a host pool's load memo recognizes it; another
shape or dtype, or an NPU DSA indexer, is a ``PoolMismatchError``.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

from sgl_ascend._device_pool import AscendDevicePool, KvSplitSpec, kv_split_spec
from sgl_core.backend import (
    Component,
    IndexerConfig,
    IndexerRows,
    MHADevicePoolBase,
    MHAPoolGeometry,
    MLADevicePoolBase,
    MLAPoolGeometry,
    byte_view,
    check_layer_id,
    check_raw_rows,
    mha_spec,
    mla_pool_spec,
)
from sgl_core.errors import PoolMismatchError

__all__ = ["AscendMHADevicePool", "AscendMLADevicePool", "engine_view"]


class AscendMLADevicePool(AscendDevicePool, MLADevicePoolBase, IndexerRows):
    """Layer-major contiguous MLA KV cache, optionally with a DSA/NSA indexer cache.

    Pass ``index_head_dim`` to add ``index_k_buffer`` for the layers in
    ``indexer_layer_ids`` (default: every layer), and ``with_index_k_scale``
    to add its fp32 per-token scale. ``indexer_slot(layer_id)`` maps a model
    layer to its row in the indexer buffers; the indexer accessors are core's
    ``IndexerRows`` over this pool's ``_rows``.
    """

    optional_buffers = ("v_buffer", "index_k_buffer", "index_k_scale_buffer")
    v_buffer: torch.Tensor | None
    index_k_buffer: torch.Tensor | None
    index_k_scale_buffer: torch.Tensor | None

    def _allocate(self, indexer: IndexerConfig | None) -> None:
        self._build(self._kv_split(indexer))

    def _kv_split(self, indexer: IndexerConfig | None = None) -> KvSplitSpec:
        """This pool's kv-split spec: ``k`` and ``v`` (or packed ``k``) plus indexer rows."""
        s, spec = self.shape, mla_pool_spec(self.shape, indexer)
        if s.packed:
            return kv_split_spec(spec, (Component("k", s.kv_cache_dim, s.dtype),))
        nope = Component("k", s.kv_lora_rank, s.dtype)
        return kv_split_spec(spec, (nope, Component("v", s.qk_rope_head_dim, s.dtype)))

    # ------------------------------------------------------------ token rows
    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, 1, qk_rope_head_dim)`` view of one layer's rope cache."""
        return self._split_v("get_value_buffer")[check_layer_id(layer_id, self.layer_num)]

    def _split_v(self, what: str) -> torch.Tensor:
        if self.v_buffer is None:  # packed rows: k_buffer holds them whole
            raise self._split_rows_error(what)
        return self.v_buffer

    def set_mla_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        """Write ``(n, 1, kv_lora_rank)`` / ``(n, 1, qk_rope_head_dim)`` rows at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        self._split_v("set_mla_kv_buffer")
        n = loc.numel()
        nope = self._values("cache_k_nope", cache_k_nope, (n, 1, self.kv_lora_rank))
        rope = self._values("cache_k_rope", cache_k_rope, (n, 1, self.qk_rope_head_dim))
        self._write(layer_id, loc, [nope, rope])

    def get_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the ``(k_nope, k_rope)`` rows at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        self._split_v("get_mla_kv_buffer")
        nope, rope = self._read(layer_id, loc, 2)
        return nope, rope

    def set_kv_rows(self, layer_id: int, loc: torch.Tensor, rows: torch.Tensor) -> None:
        """Write raw ``(n, kv_cache_dim)`` rows of the pool's dtype (no conversion) at ``loc``."""
        loc = self._check_loc(layer_id, loc)
        check_raw_rows(rows, loc.numel(), self.kv_cache_dim, self.dtype)
        raw = byte_view(rows.to(self.device).contiguous())
        widths = [b.shape[-1] for b in self.components[: self.kv_components]]
        self._write(layer_id, loc, [part.unsqueeze(1) for part in torch.split(raw, widths, dim=-1)])

    def get_kv_rows(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """A copy of the raw ``(n, kv_cache_dim)`` rows at ``loc``, of the pool's dtype."""
        loc = self._check_loc(layer_id, loc)
        parts = self._read(layer_id, loc, self.kv_components)
        return torch.cat([part[:, 0] for part in parts], dim=-1)


class AscendMHADevicePool(AscendDevicePool, MHADevicePoolBase):
    """Layer-major contiguous MHA / GQA KV cache: one K and one V 5-D tensor."""

    v_buffer: torch.Tensor

    def _allocate(self) -> None:
        self._build(self._kv_split())

    def _kv_split(self) -> KvSplitSpec:
        """This pool's kv-split spec: ``k`` and ``v``, each its own tensor."""
        spec = mha_spec(self.layer_num, self.head_num, self.head_dim, self.v_head_dim, self.dtype)
        return kv_split_spec(spec, spec.components)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, head_num, v_head_dim)`` view of one layer's V cache."""
        return self.v_buffer[check_layer_id(layer_id, self.layer_num)]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Write ``(n, head_num, head_dim)`` K and ``(n, head_num, v_head_dim)`` V rows at ``loc``.

        Every argument is checked before either buffer changes.
        """
        loc = self._check_loc(layer_id, loc)
        n = loc.numel()
        k_rows = self._values("cache_k", cache_k, (n, self.head_num, self.head_dim))
        v_rows = self._values("cache_v", cache_v, (n, self.head_num, self.v_head_dim))
        self._write(layer_id, loc, [k_rows, v_rows])

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the ``(k, v)`` rows at token ``loc``."""
        k, v = self._read(layer_id, self._check_loc(layer_id, loc), 2)
        return k, v


_views: weakref.WeakKeyDictionary[Any, AscendDevicePool] = weakref.WeakKeyDictionary()

#: Per kind (told by ``kv_lora_rank``): the view's class, its geometry and the numbers it reads.
_KINDS: dict[bool, tuple[type[AscendDevicePool], Any, tuple[str, ...]]] = {
    True: (AscendMLADevicePool, MLAPoolGeometry, ("kv_lora_rank", "qk_rope_head_dim")),
    False: (AscendMHADevicePool, MHAPoolGeometry, ("head_num", "head_dim", "v_head_dim")),
}


def _tensor(pool: Any, c: Component, shape: tuple[int, ...]) -> torch.Tensor:
    name = c.device_name
    t = getattr(pool, name, None)
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != c.dtype:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise PoolMismatchError(
            f"{type(pool).__name__}.{name} must be a {shape} {c.dtype} tensor "
            f"(the Ascend layer-major layout), got {got}"
        )
    if not t.is_contiguous():
        raise PoolMismatchError(f"{type(pool).__name__}.{name} is not contiguous")
    return t


def _view(pool: Any) -> AscendDevicePool:
    """A pool of the engine pool's kind over its own tensors (allocates nothing)."""
    if getattr(pool, "index_k_buffer", None) is not None:
        raise PoolMismatchError(
            f"{type(pool).__name__} has an indexer cache: its index keys are not mirrored"
        )
    cls, geometry, names = _KINDS[hasattr(pool, "kv_lora_rank")]
    k = pool.k_buffer
    view = cls.__new__(cls)
    geometry.__init__(
        view,
        dtype=pool.dtype,
        device=k.device if isinstance(k, torch.Tensor) else torch.device("cpu"),
        **{n: int(getattr(pool, n)) for n in ("size", "page_size", "layer_num", *names)},
    )
    view._build(view._kv_split(), lambda c, shape: _tensor(pool, c, shape))
    return view


def engine_view(pool: Any) -> Any:
    """``pool`` itself, or the cached Ascend view of an SGLang NPU pool (see the module)."""
    if isinstance(pool, AscendDevicePool) or not (  # an engine's: ``device`` a str, as SGLang's
        isinstance(getattr(pool, "device", None), str)
        and isinstance(getattr(pool, "k_buffer", None), torch.Tensor)
    ):
        return pool
    try:
        cached = _views.get(pool)
    except TypeError:
        cached = None
    if cached is not None and cached.k_buffer is pool.k_buffer:
        return cached
    try:
        view = _view(pool)
    except AttributeError as exc:
        raise PoolMismatchError(f"{type(pool).__name__} is not an NPU KV pool: {exc}") from None
    with contextlib.suppress(TypeError):  # not weak-referenceable: no caching
        _views[pool] = view
    return view
