"""The storage backend's configuration, store construction, shard key parts, v2 values.

SGLang 0.5.23 hands a ``dynamic`` backend a ``HiCacheStorageConfig`` (ranks,
model, ``extra_config``). From it come the store (file or Mooncake) and the
key parts naming which slice of a page a rank holds; its v2 calls pass pool
names and hit policies, and take a ``PoolTransferResult``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from sgl_core.errors import SGLError
from sgl_core.l3 import (
    FilePageStore,
    MooncakeConfig,
    MooncakePageStore,
    PageStore,
    PageStoreArgumentError,
)

__all__ = [
    "BLOCK_GROUPS",
    "PoolTransferResultLike",
    "build_store",
    "extra_config",
    "hit_policy",
    "policy_boundary",
    "pool_name",
    "rank_root_name",
    "shard_key_parts",
    "transfer_result",
    "transfer_slots",
]

_ALL, _TRAILING, BLOCK_GROUPS = "all_pages", "trailing_pages", "block_groups"


def extra_config(config: Any) -> Mapping[str, Any]:
    """``config.extra_config`` (SGLang's parsed ``--hicache-storage-backend-extra-config``)."""
    extra = getattr(config, "extra_config", None)
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise PageStoreArgumentError(
            f"storage extra_config must be a mapping, got {type(extra).__name__}"
        )
    return extra


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

    Ranks whose page bytes differ get different parts, ranks holding the same
    bytes share them (the table in docs/sglang.md). A field missing from
    ``config`` or out of range raises :class:`~sgl_core.l3.PageStoreArgumentError`:
    a guessed field could share a key between ranks whose bytes differ.
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


def rank_root_name(config: Any) -> str:
    """The directory a bounded file store of this rank uses under ``path``.

    A bounded root is held by one store alone (its capacity bounds the whole
    directory), so every rank gets its own, one distinct name per process
    (docs/sglang.md, "One bounded root per rank").
    """
    parts = shard_key_parts(config)
    tp_rank, tp_size = _rank(config, "tp_rank", "tp_size")
    if _flag(config, "is_mla_model") and tp_size > 1:
        parts.insert(0, f"tp{tp_rank}of{tp_size}")
    dp_rank = getattr(config, "dp_rank", 0)
    if isinstance(dp_rank, int) and not isinstance(dp_rank, bool) and dp_rank > 0:
        parts.append(f"dp{dp_rank}")
    return "-".join(parts) if parts else "rank"


def build_store(extra: Mapping[str, Any], config: Any, pool: str | None = None) -> PageStore:
    """The store ``extra`` names (``store``: ``file`` or ``mooncake``).

    ``pool`` names a host pool other than the anchor (SGLang's v2 pools, e.g.
    ``indexer``): a file store gets its own directory for it.
    """
    kind = extra.get("store", "file")
    if kind == "file":
        path = extra.get("path")
        if not isinstance(path, str) or not path:
            raise PageStoreArgumentError("extra_config needs 'path' (a directory) for store=file")
        capacity = extra.get("capacity_bytes")
        root = Path(path)
        if capacity is not None:  # one bounded root per rank (and per extra pool)
            root = root / rank_root_name(config)
        if pool is not None:
            root = root / f"pool-{pool}"
        return FilePageStore(str(root), capacity)
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


@dataclasses.dataclass
class PoolTransferResultLike:
    """SGLang's ``PoolTransferResult`` fields, used only where sglang is not importable."""

    kv_hit_pages: int
    extra_pool_hit_pages: dict[str, int]
    restorable_prefix_pages: list[int] | None = None


def transfer_result(kv_hit_pages: int, hits: dict[Any, int]) -> Any:
    """SGLang's ``PoolTransferResult`` (``PoolTransferResultLike`` without sglang)."""
    try:
        module = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:
        return PoolTransferResultLike(kv_hit_pages, hits)
    return module.PoolTransferResult(kv_hit_pages, hits)


def pool_name(name: object) -> str:
    value = getattr(name, "value", name)  # SGLang's PoolName is a str Enum
    if not isinstance(value, str) or not value:
        raise PageStoreArgumentError(f"pool name must be a non-empty str, got {name!r}")
    return value


def hit_policy(transfer: Any) -> str:
    policy = getattr(transfer, "hit_policy", _ALL)
    value = getattr(policy, "value", policy)
    if value not in (_ALL, _TRAILING, BLOCK_GROUPS):
        raise PageStoreArgumentError(f"unknown hit_policy {policy!r}")
    return str(value)


def policy_boundary(
    policy: str, kv_keys: Sequence[str], pool_keys: list[str], exists: Callable[[list[str]], int]
) -> int:
    """A v2 pool's hit (pages) under ``policy``, within the KV hit ``kv_keys`` (SGLang's rules).

    ``exists`` counts the leading pages of keys the pool's store holds whole.
    """
    kv = len(kv_keys)
    if policy == _ALL:
        return exists(list(kv_keys))
    if policy == _TRAILING:
        trailing = max(1, len(pool_keys))
        return next(
            (n for n in range(kv, 0, -1)
             if exists(list(kv_keys[max(0, n - trailing) : n])) == n - max(0, n - trailing)),
            0,
        )  # fmt: skip
    return exists(pool_keys)  # block_groups: the pool's own keys


def transfer_slots(name: str, host: Any, transfer: Any) -> tuple[list[str], torch.Tensor]:
    """A v2 transfer's keys and its host pool's own slots (an INDEXER entry's are pages)."""
    keys = getattr(transfer, "keys", None)
    idx = getattr(transfer, "host_indices", None)
    if keys is None or isinstance(keys, str):
        raise PageStoreArgumentError(f"pool {name!r}: transfer keys must be a list of str")
    if not isinstance(idx, torch.Tensor):
        raise PageStoreArgumentError(f"pool {name!r}: transfer needs host_indices")
    if idx.numel() != len(keys) * host.page_size:
        raise PageStoreArgumentError(
            f"pool {name!r}: {idx.numel()} host indices for {len(keys)} pages of "
            f"{host.page_size} tokens"
        )
    try:
        slots: torch.Tensor = host.l3_indices(idx)
    except SGLError as exc:
        raise PageStoreArgumentError(f"pool {name!r}: {exc}") from None
    return list(keys), slots
