"""``SGLangPageStorage``: SGLang 0.5.23's ``HiCacheStorage`` (v1, generic, v2) on our stores.

Store keys are SGLang's page hashes suffixed with the model name, the shard
(:func:`shard_key_parts`), the host layout and, for a pool other than the
anchor, the pool's name: a page of another model, layout, shard or pool is a
miss, never a wrong hit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from sgl_core.integrations.sglang._host import SGLangHostPool
from sgl_core.integrations.sglang._storage_config import build_store, extra_config, shard_key_parts
from sgl_core.integrations.sglang._storage_v2 import StorageV2Members
from sgl_core.l3 import PageStore, PageStoreArgumentError, PageStoreStats

__all__ = ["SGLangPageStorage"]


class SGLangPageStorage(StorageV2Members):
    """SGLang's ``HiCacheStorage`` (v1, generic and v2 calls) on :class:`sgl_core.l3.PageStore`.

    ``SGLangPageStorage(storage_config, kwargs)`` is how SGLang's factory
    builds a ``dynamic`` backend; ``store=`` passes a ready store instead of
    building one from ``storage_config.extra_config``, and ``pool_stores=``
    ready stores for v2 pools other than the anchor (by pool name).
    """

    def __init__(
        self,
        storage_config: Any,
        kwargs: Any = None,
        *,
        store: PageStore | None = None,
        pool_stores: Mapping[str, PageStore] | None = None,
    ) -> None:
        extra = extra_config(storage_config)
        self._config = storage_config
        self._extra = extra
        model = getattr(storage_config, "model_name", None)
        # "@" separates key parts: escaped in the model name, no name forges a shard part.
        name = str(model).replace("%", "%25").replace("@", "%40") if model else "-"
        self._suffix_parts = [name, *shard_key_parts(storage_config)]
        self._store: PageStore = store if store is not None else build_store(extra, storage_config)
        self._given_pool_stores = dict(pool_stores or {})
        self._injected = store is not None
        self._suffix = ""
        self._pools = {}
        self.mem_pool_host: SGLangHostPool | None = None

    @property
    def store(self) -> PageStore:
        return self._store

    # ------------------------------------------------------------ setup
    def register_mem_pool_host(self, mem_pool_host: SGLangHostPool) -> None:
        if not isinstance(mem_pool_host, SGLangHostPool):
            raise PageStoreArgumentError(
                "register_mem_pool_host needs a host pool wrapped by "
                f"sgl_core.integrations.sglang.wrap_host_pool, got {type(mem_pool_host).__name__}"
            )
        self._store.register_host_pool(mem_pool_host.pool)
        self.mem_pool_host = mem_pool_host
        self._suffix = "@" + "@".join([*self._suffix_parts, mem_pool_host.layout])

    def on_host_pools_registered(self) -> None:
        """Nothing to finalize: every store was bound when its pool was registered."""

    def _pool_store(self, name: str) -> PageStore:
        if name in self._given_pool_stores:
            return self._given_pool_stores[name]
        if self._injected:
            raise PageStoreArgumentError(
                f"no store for pool {name!r}: pass pool_stores={{{name!r}: store}} with store="
            )
        return build_store(self._extra, self._config, pool=name)

    def _keys(self, keys: Sequence[str], pool: str | None = None) -> list[str]:
        if isinstance(keys, str):
            raise PageStoreArgumentError("keys must be a sequence of str, got one str")
        if self.mem_pool_host is None:
            raise PageStoreArgumentError("call register_mem_pool_host before moving pages")
        suffix = self._suffix if pool is None else f"{self._suffix}@pool-{pool}"
        return [f"{k}{suffix}" if isinstance(k, str) and k else k for k in keys]

    # ---------------------------------------------------- v1 (zero-copy)
    def batch_exists(self, keys: Sequence[str], extra_info: Any = None) -> int:
        """Consecutive keys, from the first, whose pages are stored whole."""
        if not keys:
            return 0
        return self._store.batch_exists(self._keys(keys))

    def batch_get_v1(
        self, keys: Sequence[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        return self._store.batch_get(self._keys(keys), host_indices)

    def batch_set_v1(
        self, keys: Sequence[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        return self._store.batch_set(self._keys(keys), host_indices)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ------------------------------------- generic (flat page tensors)
    def _bounce(self) -> tuple[SGLangHostPool, torch.Tensor] | None:
        """One free host page to stage a flat page through (None: pool full, a miss)."""
        host = self.mem_pool_host
        if host is None:
            raise PageStoreArgumentError("call register_mem_pool_host before moving pages")
        slots = host.alloc(host.page_size)
        return None if slots is None else (host, slots)

    def get(
        self, key: str, target_location: Any = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        """The flat page stored under ``key`` (into ``target_location`` if given), or None."""
        bounce = self._bounce()
        if bounce is None:
            return None
        host, slots = bounce
        try:
            if not self._store.batch_get(self._keys([key]), slots)[0]:
                return None
            page = host.get_data_page(int(slots[0]))
        finally:
            host.free(slots)
        if isinstance(target_location, torch.Tensor):
            target_location.copy_(page.reshape(target_location.shape))
            return target_location
        return page

    def batch_get(
        self, keys: Sequence[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets, strict=True)]

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Store the flat page ``value`` under ``key``; False when it could not be stored."""
        if not isinstance(value, torch.Tensor):
            raise PageStoreArgumentError("set needs value= a flat page tensor")
        bounce = self._bounce()
        if bounce is None:
            return False
        host, slots = bounce
        try:
            host.set_from_flat_data_page(int(slots[0]), value)
            return bool(self._store.batch_set(self._keys([key]), slots)[0])
        finally:
            host.free(slots)

    def batch_set(
        self,
        keys: Sequence[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        if values is None:
            raise PageStoreArgumentError("batch_set needs values= flat page tensors")
        return all([self.set(k, v) for k, v in zip(keys, list(values), strict=True)])

    # ------------------------------------------------------ housekeeping
    def _stores(self) -> list[PageStore]:
        stores = [self._store]
        for _, store in self._pools.values():
            if all(store is not s for s in stores):
                stores.append(store)
        return stores

    def clear(self) -> None:
        for store in self._stores():
            store.clear()

    def get_stats(self) -> PageStoreStats:
        return self._store.stats()

    def close(self) -> None:
        for store in self._stores():
            close = getattr(store, "close", None)
            if callable(close):
                close()
