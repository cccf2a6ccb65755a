"""An SGLang (0.5.23) HiCache storage backend over our L3 page stores.

SGLang loads it with its ``dynamic`` storage backend::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{
        "backend_name": "sgl_l3",
        "module_path": "sgl_core.integrations.sglang_storage",
        "class_name": "SGLangPageStorage",
        "interface_v1": 1,
        "store": "file", "path": "/var/cache/sgl-l3", "capacity_bytes": 68719476736}'

``interface_v1: 1`` makes SGLang's controller use the zero-copy calls
(``batch_get_v1``/``batch_set_v1``: pages move between the store and host-pool
slots directly). ``"store": "mooncake"`` with ``"mooncake": {...}``
(:class:`sgl_core.l3.MooncakeConfig` fields) uses the Mooncake store instead.
The host pool SGLang registers must be one of ours wrapped by
:func:`sgl_core.integrations.sglang.wrap_host_pool`.

SGLang's factory accepts only subclasses of its ``HiCacheStorage``. This
module does not import sglang to define the class: when sglang is installed,
importing the module registers :class:`SGLangPageStorage` as a virtual
subclass of ``HiCacheStorage`` (an ABC). Where sglang is missing the module
still imports and the class works on its own.

Store keys are SGLang's page hashes (see ``page_keys(..., scheme="sglang")``)
suffixed with the model name, the host layout (pages of different byte orders
never meet) and, where pages differ between ranks, the shard (TP rank for
non-replicated pools, PP stage, attention CP rank, DCP shard; see
:func:`shard_key_parts`): a page of another model, layout or shard is a miss,
never a wrong hit.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from sgl_core.integrations.sglang import SGLangHostPool
from sgl_core.l3 import (
    FilePageStore,
    MooncakeConfig,
    MooncakePageStore,
    PageStore,
    PageStoreArgumentError,
    PageStoreStats,
)

__all__ = ["SGLangPageStorage", "register_with_sglang", "shard_key_parts"]


def _extra(config: Any) -> Mapping[str, Any]:
    extra = getattr(config, "extra_config", None)
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise PageStoreArgumentError(
            f"storage extra_config must be a mapping, got {type(extra).__name__}"
        )
    return extra


def _build_store(extra: Mapping[str, Any]) -> PageStore:
    kind = extra.get("store", "file")
    if kind == "file":
        path = extra.get("path")
        if not isinstance(path, str) or not path:
            raise PageStoreArgumentError("extra_config needs 'path' (a directory) for store=file")
        return FilePageStore(path, extra.get("capacity_bytes"))
    if kind == "mooncake":
        fields = extra.get("mooncake", {})
        if not isinstance(fields, Mapping):
            raise PageStoreArgumentError("extra_config 'mooncake' must be a mapping")
        try:
            mooncake = MooncakeConfig(**dict(fields))
        except TypeError as exc:
            raise PageStoreArgumentError(f"extra_config 'mooncake': {exc}") from None
        return MooncakePageStore(mooncake)
    raise PageStoreArgumentError(f"extra_config 'store' must be 'file' or 'mooncake', got {kind!r}")


def _field(config: Any, name: str) -> Any:
    if not hasattr(config, name):
        raise PageStoreArgumentError(
            f"storage config has no {name!r}: pages could not be keyed per shard"
        )
    return getattr(config, name)


def _flag(config: Any, name: str) -> bool:
    value = _field(config, name)
    if not isinstance(value, bool):
        raise PageStoreArgumentError(
            f"storage config {name} must be a bool, got {type(value).__name__}"
        )
    return value


def _count(config: Any, name: str, low: int) -> int:
    value = _field(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PageStoreArgumentError(
            f"storage config {name} must be an int >= {low}, got {value!r}"
        )
    return value


def _rank(config: Any, rank: str, size: str) -> tuple[int, int]:
    r, n = _count(config, rank, 0), _count(config, size, 1)
    if r >= n:
        raise PageStoreArgumentError(f"storage config {rank}={r} is not below {size}={n}")
    return r, n


def shard_key_parts(config: Any) -> list[str]:
    """The key parts naming which slice of a page this rank holds (SGLang 0.5.23's rules).

    Ranks whose page bytes differ get different parts; ranks holding the same
    bytes share them, as in SGLang's own ``HiCacheFile`` backend: TP ranks share
    rank-replicated (``is_mla_model``) pages and split the others (heads); every
    pipeline stage (``pp_size > 1``), attention context-parallel rank
    (``attn_cp_size > 1``) and decode context-parallel shard (``dcp_size > 1``,
    with the TP size and the logical page size) holds its own pages. A field
    missing from ``config`` or out of range raises
    :class:`~sgl_core.l3.PageStoreArgumentError`: a guessed field could share a
    key between ranks whose bytes differ.
    """
    replicated = _flag(config, "is_mla_model")
    tp_rank, tp_size = _rank(config, "tp_rank", "tp_size")
    pp_rank, pp_size = _rank(config, "pp_rank", "pp_size")
    cp_rank, cp_size = _rank(config, "attn_cp_rank", "attn_cp_size")
    dcp_rank, dcp_size = _rank(config, "dcp_rank", "dcp_size")
    parts = [] if replicated else [f"tp{tp_rank}of{tp_size}"]
    if pp_size > 1:  # each pipeline stage holds other layers
        parts.append(f"pp{pp_rank}of{pp_size}")
    if cp_size > 1:  # each attention CP rank holds its own slice of every page
        parts.append(f"cp{cp_rank}of{cp_size}")
    if dcp_size > 1:  # a DCP shard of a page, in a TP group of this size
        page = _count(config, "logical_page_size", 1)
        parts.append(f"dcp{dcp_rank}of{dcp_size}tp{tp_size}page{page}")
    return parts


class SGLangPageStorage:
    """SGLang's ``HiCacheStorage`` v1 interface on a :class:`sgl_core.l3.PageStore`.

    ``SGLangPageStorage(storage_config, kwargs)`` is how SGLang's factory
    builds a ``dynamic`` backend; ``store=`` passes a ready store instead of
    building one from ``storage_config.extra_config``.
    """

    def __init__(
        self, storage_config: Any, kwargs: Any = None, *, store: PageStore | None = None
    ) -> None:
        extra = _extra(storage_config)
        self._store: PageStore = store if store is not None else _build_store(extra)
        model = getattr(storage_config, "model_name", None)
        # "@" separates key parts: escaped in the model name, no name forges a shard part.
        name = str(model).replace("%", "%25").replace("@", "%40") if model else "-"
        self._suffix_parts = [name, *shard_key_parts(storage_config)]
        self._suffix = ""
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
        """Nothing to finalize: the store was bound in ``register_mem_pool_host``."""

    def _keys(self, keys: Sequence[str]) -> list[str]:
        if isinstance(keys, str):
            raise PageStoreArgumentError("keys must be a sequence of str, got one str")
        return [f"{k}{self._suffix}" if isinstance(k, str) and k else k for k in keys]

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
    def clear(self) -> None:
        self._store.clear()

    def get_stats(self) -> PageStoreStats:
        return self._store.stats()

    def close(self) -> None:
        close = getattr(self._store, "close", None)
        if callable(close):
            close()


def register_with_sglang() -> bool:
    """Make :class:`SGLangPageStorage` a (virtual) ``HiCacheStorage``; False without sglang."""
    try:
        if importlib.util.find_spec("sglang") is None:
            return False
        module = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:  # an unrelated or partial "sglang" on the path
        return False
    module.HiCacheStorage.register(SGLangPageStorage)
    return True


register_with_sglang()
