"""SGLang 0.5.23's v2 (host pool group) storage calls of ``SGLangPageStorage``.

Each registered pool has its own store and key suffix; every call is checked
in full before any byte moves (a bad call raises ``PageStoreArgumentError``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from sgl_core.errors import SGLError
from sgl_core.integrations.sglang._host import SGLangHostPool
from sgl_core.integrations.sglang._indexer_pool import SGLangIndexerHostPool
from sgl_core.l3 import PageStore, PageStoreArgumentError, page_format
from sgl_core.l3._pages import resolve_pages

__all__ = ["PoolTransferResultLike", "StorageV2Members"]

_ALL, _TRAILING, _BLOCKS = "all_pages", "trailing_pages", "block_groups"
_Registered = SGLangHostPool | SGLangIndexerHostPool


@dataclasses.dataclass
class PoolTransferResultLike:
    """SGLang's ``PoolTransferResult`` fields, used only where sglang is not importable."""

    kv_hit_pages: int
    extra_pool_hit_pages: dict[str, int]
    restorable_prefix_pages: list[int] | None = None


def _result(kv_hit_pages: int, hits: dict[Any, int]) -> Any:
    try:
        module = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:
        return PoolTransferResultLike(kv_hit_pages, hits)
    return module.PoolTransferResult(kv_hit_pages, hits)


def _name(name: object) -> str:
    value = getattr(name, "value", name)  # SGLang's PoolName is a str Enum
    if not isinstance(value, str) or not value:
        raise PageStoreArgumentError(f"pool name must be a non-empty str, got {name!r}")
    return value


def _policy(transfer: Any) -> str:
    policy = getattr(transfer, "hit_policy", _ALL)
    value = getattr(policy, "value", policy)
    if value not in (_ALL, _TRAILING, _BLOCKS):
        raise PageStoreArgumentError(f"unknown hit_policy {policy!r}")
    return str(value)


class StorageV2Members:
    """Mixin of ``SGLangPageStorage``: the registered pools and the v2 calls."""

    if TYPE_CHECKING:
        mem_pool_host: SGLangHostPool | None
        _store: PageStore

        def _keys(self, keys: Sequence[str], pool: str | None = None) -> list[str]: ...

        def _pool_store(self, name: str) -> PageStore: ...

    _pools: dict[str, tuple[_Registered, PageStore]]

    # ------------------------------------------------------------ setup
    def register_mem_host_pool_v2(self, host_pool: _Registered, host_pool_name: Any) -> None:
        """Bind one ``HostPoolGroup`` entry's host pool to a store of its own.

        The anchor pool (the one ``register_mem_pool_host`` bound) keeps the
        anchor's store and keys; any other pool gets its own store and a key
        part naming the pool.
        """
        name = _name(host_pool_name)
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
        store = self._pool_store(name)
        store.register_host_pool(host_pool.pool)
        self._pools[name] = (host_pool, store)

    def _anchor_name(self) -> str | None:
        return next((n for n, (h, _) in self._pools.items() if h is self.mem_pool_host), None)

    def _scoped(self, name: str, keys: Sequence[str]) -> list[str]:
        return self._keys(keys, None if name == self._anchor_name() else name)

    def _entry(self, transfer: Any) -> tuple[str, _Registered, PageStore]:
        name = _name(getattr(transfer, "name", None))
        if name not in self._pools:
            raise PageStoreArgumentError(
                f"pool {name!r} is not registered (register_mem_host_pool_v2 first)"
            )
        host, store = self._pools[name]
        return name, host, store

    # ------------------------------------------------------------ calls
    def batch_exists_v2(
        self, keys: Sequence[str], pool_transfers: Any = None, extra_info: Any = None
    ) -> Any:
        """The usable KV prefix (pages) with every pool's own boundary, as SGLang folds them."""
        if isinstance(keys, str):
            raise PageStoreArgumentError("keys must be a sequence of str, got one str")
        transfers = list(pool_transfers or [])
        checked = [
            (self._entry(t), _policy(t), list(getattr(t, "keys", None) or [])) for t in transfers
        ]
        kv = self._store.batch_exists(self._keys(keys)) if keys else 0
        hits: dict[Any, int] = {}
        if kv:
            hits[self._anchor_name() or "kv"] = kv
        final = kv
        for t, ((name, _, store), policy, t_keys) in zip(transfers, checked, strict=True):
            if final == 0:
                break
            exists = self._exists_fn(name, store)
            if policy == _ALL:
                boundary = exists(list(keys[:kv]))
            elif policy == _TRAILING:
                trailing = max(1, len(t_keys))
                boundary = next(
                    (n for n in range(kv, 0, -1)
                     if exists(list(keys[max(0, n - trailing) : n])) == n - max(0, n - trailing)),
                    0,
                )  # fmt: skip
            else:  # block_groups: the pool's own verdict, never a gate on the KV hit
                hits[t.name] = exists(t_keys)
                continue
            if boundary:
                hits[t.name] = boundary
            final = min(final, boundary)
        return _result(final, hits)

    def _exists_fn(self, name: str, store: PageStore) -> Callable[[list[str]], int]:
        def exists(keys: list[str]) -> int:
            return store.batch_exists(self._scoped(name, keys)) if keys else 0

        return exists

    def _checked_transfers(
        self, transfers: Any
    ) -> list[tuple[Any, str, _Registered, PageStore, list[str], torch.Tensor]]:
        if transfers is None or isinstance(transfers, (str, bytes)):
            raise PageStoreArgumentError("transfers must be a list of PoolTransfer")
        out = []
        for t in list(transfers):
            name, host, store = self._entry(t)
            keys = getattr(t, "keys", None)
            idx = getattr(t, "host_indices", None)
            if keys is None or isinstance(keys, str):
                raise PageStoreArgumentError(f"pool {name!r}: transfer keys must be a list of str")
            if not isinstance(idx, torch.Tensor):
                raise PageStoreArgumentError(f"pool {name!r}: transfer needs host_indices")
            if idx.numel() != len(keys) * host.page_size:
                raise PageStoreArgumentError(
                    f"pool {name!r}: {idx.numel()} host indices for {len(keys)} pages of "
                    f"{host.page_size} tokens"
                )
            # The store's own checks (key form, index dtype, range, whole pages,
            # duplicates) for every transfer before the first one moves a byte,
            # on the pool's own slots (an INDEXER entry's are pages).
            try:
                slots = host.l3_indices(idx)
            except SGLError as exc:
                raise PageStoreArgumentError(f"pool {name!r}: {exc}") from None
            resolve_pages(host.pool, page_format(host.pool), self._scoped(name, keys), slots)
            out.append((t, name, host, store, list(keys), slots))
        return out

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        """Load each transfer's pages into its pool's host slots; per pool, per page, hit or not."""
        checked = self._checked_transfers(transfers)
        return {
            t.name: store.batch_get(self._scoped(name, keys), idx) if keys else []
            for t, name, _, store, keys, idx in checked
        }

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[Any, list[bool]]:
        """Store each transfer's host pages under its keys; per pool, per page, stored or not."""
        checked = self._checked_transfers(transfers)
        return {
            t.name: store.batch_set(self._scoped(name, keys), idx) if keys else []
            for t, name, _, store, keys, idx in checked
        }
