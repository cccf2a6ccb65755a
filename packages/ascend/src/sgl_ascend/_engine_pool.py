"""SGLang's NPU device pools seen as the Ascend backend's device pools (no copy).

SGLang 0.5.23's ``NPUMLATokenToKVPool`` keeps ``k_buffer`` (the nope part) and
``v_buffer`` (the rope part) as 5-D layer-major tensors ``(layer_num,
page_num, page_size, 1, dim)``, and ``NPUMHATokenToKVPool`` K and V as
``(layer_num, page_num, page_size, head_num, dim)``: exactly the components of
:class:`AscendMLADevicePool` / :class:`AscendMHADevicePool`. :func:`engine_view`
returns a pool of that kind whose buffers *are* the engine's tensors (same
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

from sgl_ascend._device_kinds import AscendMHADevicePool, AscendMLADevicePool
from sgl_ascend._device_pool import AscendDevicePool
from sgl_core.backend import Component, MHAPoolGeometry, MLAPoolGeometry
from sgl_core.errors import PoolMismatchError

__all__ = ["engine_view"]

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


def _is_engine_pool(pool: Any) -> bool:
    """An engine's pool (``device`` a str, as SGLang's) with one 5-D K tensor."""
    k = getattr(pool, "k_buffer", None)
    return isinstance(getattr(pool, "device", None), str) and isinstance(k, torch.Tensor)


def engine_view(pool: Any) -> Any:
    """``pool`` itself, or the cached Ascend view of an SGLang NPU pool (see the module)."""
    if isinstance(pool, AscendDevicePool) or not _is_engine_pool(pool):
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
