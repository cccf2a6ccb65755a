"""An engine's own device pool seen through our protocol: one cached view per pool.

``sgl_core.kv.device._foreign_pool`` (MLA, MHA) and ``_paged_indexer``
(SGLang's DSA pool, with its indexer pages) wrap an engine's pool; one whose
``device`` is a ``torch.device`` is ours already and is returned as is. The
view is cached per engine pool (weakly), so the per-layer load memo, which
compares device pools by identity, recognizes the pool from one layer to the
next.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from sgl_core.kv.device._foreign_pool import ForeignMHADevicePool, ForeignMLADevicePool
from sgl_core.kv.device._paged_indexer import ForeignPagedIndexerPool, has_paged_indexer
from sgl_core.kv.protocols._kv_protocols import MHADevicePool, MLADevicePool

__all__ = ["as_device_pool", "as_mha_device_pool"]

ViewT = TypeVar("ViewT", ForeignMLADevicePool, ForeignMHADevicePool)

_views: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _cached(pool: Any, kind: type[ViewT], make: Callable[[Any], ViewT]) -> ViewT | None:
    """``pool``'s cached view of ``kind`` (made once); None when ``pool`` is ours already."""
    if isinstance(pool, kind) or isinstance(getattr(pool, "device", None), torch.device):
        return None
    try:
        view = _views.get(pool)
    except TypeError:  # not weak-referenceable or not hashable: no caching
        return make(pool)
    if not isinstance(view, kind) or view.wrapped is not pool:
        view = make(pool)
        with contextlib.suppress(TypeError):
            _views[pool] = view
    return view


def _mla_view(pool: Any) -> ForeignMLADevicePool:
    # An indexer kept in pages (SGLang's DSATokenToKVPool) gets the view that mirrors it.
    return ForeignPagedIndexerPool(pool) if has_paged_indexer(pool) else ForeignMLADevicePool(pool)


def as_device_pool(pool: Any) -> MLADevicePool:
    """``pool`` itself if its ``device`` is a ``torch.device``, else a cached view of it."""
    view = _cached(pool, ForeignMLADevicePool, _mla_view)
    typed: MLADevicePool = pool if view is None else view
    return typed


def as_mha_device_pool(pool: Any) -> MHADevicePool:
    """``pool`` itself if its ``device`` is a ``torch.device``, else a cached view of it."""
    view = _cached(pool, ForeignMHADevicePool, ForeignMHADevicePool)
    typed: MHADevicePool = pool if view is None else view
    return typed
