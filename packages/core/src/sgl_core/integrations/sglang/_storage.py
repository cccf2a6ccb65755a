"""``SGLangPageStorage``: SGLang 0.5.23's ``HiCacheStorage`` (v1, generic, v2) on our stores.

Store keys (model, shard, layout and pool suffixes, so a page of another one
is a miss) and the v2 checks: docs/sglang.md.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from sgl_core.integrations.sglang._host import SGLangHostPool
from sgl_core.integrations.sglang._indexer_pool import SGLangIndexerHostPool
from sgl_core.integrations.sglang._storage_config import (
    BLOCK_GROUPS,
    build_store,
    extra_config,
    hit_policy,
    policy_boundary,
    pool_name,
    shard_key_parts,
    transfer_result,
    transfer_slots,
)
from sgl_core.l3 import PageStore, PageStoreArgumentError, PageStoreStats, page_format
from sgl_core.l3._pages import resolve_pages

__all__ = ["SGLangPageStorage"]

_Registered = SGLangHostPool | SGLangIndexerHostPool


class SGLangPageStorage:
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
        self._pools: dict[str, tuple[_Registered, PageStore]] = {}
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

    def _keys(self, keys: Sequence[str], pool: str | None = None) -> list[str]:
        if isinstance(keys, str):
            raise PageStoreArgumentError("keys must be a sequence of str, got one str")
        if self.mem_pool_host is None:
            raise PageStoreArgumentError("call register_mem_pool_host before moving pages")
        anchor = pool is None or pool == self._anchor_name()
        suffix = self._suffix if anchor else f"{self._suffix}@pool-{pool}"
        return [f"{k}{suffix}" if isinstance(k, str) and k else k for k in keys]

    def _hits(self, store: PageStore, keys: Sequence[str], pool: str | None = None) -> int:
        """Leading pages of ``keys`` ``store`` holds whole (no store call for no keys)."""
        return store.batch_exists(self._keys(keys, pool)) if keys else 0

    # ---------------------------------------------------- v1 (zero-copy)
    def batch_exists(self, keys: Sequence[str], extra_info: Any = None) -> int:
        """Consecutive keys, from the first, whose pages are stored whole."""
        return self._hits(self._store, keys)

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
    def _bounce(self, key: str) -> tuple[list[str], SGLangHostPool, torch.Tensor | None]:
        """``key`` as a store key, and one free host page to stage a flat page through
        (None: pool full, a miss)."""
        keys = self._keys([key])  # refuses before register_mem_pool_host
        host = cast(SGLangHostPool, self.mem_pool_host)
        return keys, host, host.alloc(host.page_size)

    def get(
        self, key: str, target_location: Any = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        """The flat page stored under ``key`` (into ``target_location`` if given), or None."""
        keys, host, slots = self._bounce(key)
        if slots is None:
            return None
        try:
            if not self._store.batch_get(keys, slots)[0]:
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
        keys, host, slots = self._bounce(key)
        if slots is None:
            return False
        try:
            host.set_from_flat_data_page(int(slots[0]), value)
            return bool(self._store.batch_set(keys, slots)[0])
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

    # ------------------------------------------------------------ v2
    def register_mem_host_pool_v2(self, host_pool: _Registered, host_pool_name: Any) -> None:
        """Bind one ``HostPoolGroup`` entry's host pool to a store of its own (the anchor,
        bound by ``register_mem_pool_host``, keeps the anchor's store and keys)."""
        name = pool_name(host_pool_name)
        if not isinstance(host_pool, (SGLangHostPool, SGLangIndexerHostPool)):
            raise PageStoreArgumentError(
                "register_mem_host_pool_v2 needs a host pool wrapped by "
                "sgl_core.integrations.sglang.wrap_host_pool (or the INDEXER entry of "
                f"indexer_host_pool_builder), got {type(host_pool).__name__}"
            )
        if name in self._pools:
            if self._pools[name][0] is host_pool:
                return
            raise PageStoreArgumentError(f"host pool {name!r} is already registered")
        if host_pool is self.mem_pool_host:
            self._pools[name] = (host_pool, self._store)
            return
        store = self._given_pool_stores.get(name)
        if store is None and self._injected:
            raise PageStoreArgumentError(
                f"no store for pool {name!r}: pass pool_stores={{{name!r}: store}} with store="
            )
        if store is None:
            store = build_store(self._extra, self._config, pool=name)
        store.register_host_pool(host_pool.pool)
        self._pools[name] = (host_pool, store)

    def _anchor_name(self) -> str | None:
        return next((n for n, (h, _) in self._pools.items() if h is self.mem_pool_host), None)

    def _entry(self, transfer: Any) -> tuple[str, _Registered, PageStore]:
        name = pool_name(getattr(transfer, "name", None))
        if name not in self._pools:
            raise PageStoreArgumentError(
                f"pool {name!r} is not registered (register_mem_host_pool_v2 first)"
            )
        host, store = self._pools[name]
        return name, host, store

    def batch_exists_v2(
        self, keys: Sequence[str], pool_transfers: Any = None, extra_info: Any = None
    ) -> Any:
        """The usable KV prefix (pages) with every pool's own boundary, as SGLang folds them."""
        if isinstance(keys, str):
            raise PageStoreArgumentError("keys must be a sequence of str, got one str")
        transfers = list(pool_transfers or [])
        checked = [
            (self._entry(t), hit_policy(t), list(getattr(t, "keys", None) or [])) for t in transfers
        ]
        kv = self._hits(self._store, keys)
        hits: dict[Any, int] = {}
        if kv:
            hits[self._anchor_name() or "kv"] = kv
        final = kv
        for t, ((name, _, store), policy, t_keys) in zip(transfers, checked, strict=True):
            if final == 0:
                break
            exists = functools.partial(self._hits, store, pool=name)
            boundary = policy_boundary(policy, keys[:kv], t_keys, exists)
            if policy == BLOCK_GROUPS:  # the pool's own verdict, never a gate on the KV hit
                hits[t.name] = boundary
                continue
            if boundary:
                hits[t.name] = boundary
            final = min(final, boundary)
        return transfer_result(final, hits)

    def _move_v2(self, transfers: Any, load: bool) -> dict[Any, list[bool]]:
        if transfers is None or isinstance(transfers, (str, bytes)):
            raise PageStoreArgumentError("transfers must be a list of PoolTransfer")
        checked = []
        for t in list(transfers):
            name, host, store = self._entry(t)
            keys, slots = transfer_slots(name, host, t)
            scoped = self._keys(keys, name)
            # The store's own checks (key form, index dtype, range, whole pages,
            # duplicates) for every transfer before the first one moves a byte.
            resolve_pages(host.pool, page_format(host.pool), scoped, slots)
            checked.append((t.name, store.batch_get if load else store.batch_set, scoped, slots))
        return {pool: move(k, slots) if k else [] for pool, move, k, slots in checked}

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        """Load each transfer's pages into its pool's host slots; per pool, per page, hit or not."""
        return self._move_v2(transfers, load=True)

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        """Store each transfer's host pages under its keys; per pool, per page, stored or not."""
        return self._move_v2(transfers, load=False)

    # ------------------------------------------------------ housekeeping
    def _stores(self) -> list[PageStore]:
        stores = [self._store, *(store for _, store in self._pools.values())]
        return list({id(store): store for store in stores}.values())

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
