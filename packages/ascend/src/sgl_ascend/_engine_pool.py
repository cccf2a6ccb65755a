"""SGLang's NPU device pools seen as the Ascend backend's device pools (no copy).

SGLang 0.5.23's ``NPUMLATokenToKVPool`` keeps ``k_buffer`` (the nope part) and
``v_buffer`` (the rope part) as 5-D layer-major tensors ``(layer_num,
page_num, page_size, 1, dim)``, and ``NPUMHATokenToKVPool`` K and V as
``(layer_num, page_num, page_size, head_num, dim)``: exactly the tensors of
:class:`AscendMLADevicePool` / :class:`AscendMHADevicePool`. :func:`engine_view`
returns a view of such a pool whose buffers *are* the engine's tensors (same
objects, nothing allocated), cached per pool so a host pool's per-layer load
memo still recognizes it. Refused with ``PoolMismatchError`` (nothing is
guessed): tensors of another shape, a stored dtype other than the pool's
``dtype`` (fp8 kept as ``uint8``), and an NPU DSA indexer (not mirrored).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

from sgl_ascend._device_pool import AscendMLADevicePool
from sgl_ascend._mha_device_pool import AscendMHADevicePool
from sgl_core.backend import MHAPoolGeometry, MLAPoolGeometry
from sgl_core.errors import PoolMismatchError

__all__ = ["engine_view"]

_views: weakref.WeakKeyDictionary[Any, AscendMLADevicePool | AscendMHADevicePool] = (
    weakref.WeakKeyDictionary()
)


def _tensor(pool: Any, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    t = getattr(pool, name, None)
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise PoolMismatchError(
            f"{type(pool).__name__}.{name} must be a {shape} {dtype} tensor "
            f"(the Ascend layer-major layout), got {got}"
        )
    if not t.is_contiguous():
        raise PoolMismatchError(f"{type(pool).__name__}.{name} is not contiguous")
    return t


class _EngineMLAView(AscendMLADevicePool):
    """An ``AscendMLADevicePool`` over an NPU MLA pool's own tensors."""

    def __init__(self, pool: Any) -> None:  # allocates nothing
        if getattr(pool, "index_k_buffer", None) is not None:
            raise PoolMismatchError(
                f"{type(pool).__name__} has an indexer cache: its index keys are not mirrored"
            )
        k = pool.k_buffer
        MLAPoolGeometry.__init__(
            self, size=int(pool.size), page_size=int(pool.page_size), dtype=pool.dtype,
            kv_lora_rank=int(pool.kv_lora_rank), qk_rope_head_dim=int(pool.qk_rope_head_dim),
            layer_num=int(pool.layer_num), device=k.device if isinstance(k, torch.Tensor)
            else torch.device("cpu"),
        )  # fmt: skip
        pages = (self.layer_num, self.page_num, self.page_size, 1)
        self._index_head_dim = None
        self._indexer_layer_ids = ()
        self._slots = {}
        self.k_buffer = _tensor(pool, "k_buffer", (*pages, self.kv_lora_rank), self.dtype)
        self.v_buffer = _tensor(pool, "v_buffer", (*pages, self.qk_rope_head_dim), self.dtype)
        self.index_k_buffer = None
        self.index_k_scale_buffer = None


class _EngineMHAView(AscendMHADevicePool):
    """An ``AscendMHADevicePool`` over an NPU MHA pool's own tensors."""

    def __init__(self, pool: Any) -> None:  # allocates nothing
        k = pool.k_buffer
        MHAPoolGeometry.__init__(
            self, size=int(pool.size), page_size=int(pool.page_size), dtype=pool.dtype,
            head_num=int(pool.head_num), head_dim=int(pool.head_dim),
            layer_num=int(pool.layer_num), v_head_dim=int(pool.v_head_dim),
            device=k.device if isinstance(k, torch.Tensor) else torch.device("cpu"),
        )  # fmt: skip
        pages = (self.layer_num, self.page_num, self.page_size, self.head_num)
        self.k_buffer = _tensor(pool, "k_buffer", (*pages, self.head_dim), self.dtype)
        self.v_buffer = _tensor(pool, "v_buffer", (*pages, self.v_head_dim), self.dtype)


def _is_engine_pool(pool: Any) -> bool:
    """An engine's pool (``device`` a str, as SGLang's) with one 5-D K tensor."""
    k = getattr(pool, "k_buffer", None)
    return isinstance(getattr(pool, "device", None), str) and isinstance(k, torch.Tensor)


def engine_view(pool: Any) -> Any:
    """``pool`` itself, or the cached Ascend view of an SGLang NPU pool (see the module)."""
    if isinstance(pool, (AscendMLADevicePool, AscendMHADevicePool)) or not _is_engine_pool(pool):
        return pool
    try:
        cached = _views.get(pool)
    except TypeError:
        cached = None
    if cached is not None and cached.k_buffer is pool.k_buffer:
        return cached
    view: AscendMLADevicePool | AscendMHADevicePool
    try:
        view = _EngineMLAView(pool) if hasattr(pool, "kv_lora_rank") else _EngineMHAView(pool)
    except AttributeError as exc:
        raise PoolMismatchError(f"{type(pool).__name__} is not an NPU KV pool: {exc}") from None
    with contextlib.suppress(TypeError):  # not weak-referenceable: no caching
        _views[pool] = view
    return view
