"""The :class:`PageStore` contract and its statistics record.

The semantics every store keeps are docs/design.md section 8 ("Contract"),
checked by ``tests/l3/test_l3_conformance.py`` and ``tests/l3/test_l3_faults.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from sgl_core.kv.protocols._kv_protocols import KVHostPool

__all__ = ["PageStore", "PageStoreStats"]


@dataclasses.dataclass(frozen=True)
class PageStoreStats:
    """Counters since the store was built (or ``clear()``-ed: contents only, not counters).

    ``errors`` maps a failure reason (``"missing"``, ``"corrupt"``,
    ``"no_space"``, ``"RPC_FAIL"``, ...) to how many objects hit it.
    ``stored_pages``/``stored_bytes`` are ``None`` where the store cannot
    know them cheaply (a shared distributed store).
    """

    pages_set: int = 0
    pages_set_failed: int = 0
    pages_skipped: int = 0
    pages_get: int = 0
    pages_get_failed: int = 0
    bytes_set: int = 0
    bytes_get: int = 0
    evicted_pages: int = 0
    stored_pages: int | None = None
    stored_bytes: int | None = None
    errors: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, int],
        errors: Mapping[str, int],
        *,
        stored_pages: int | None = None,
        stored_bytes: int | None = None,
    ) -> PageStoreStats:
        """Stats from a store's running counters (a missing counter is 0)."""
        counters = {
            f.name: int(counts.get(f.name, 0))
            for f in dataclasses.fields(cls)
            if f.name not in ("stored_pages", "stored_bytes", "errors")
        }
        return cls(
            **counters,
            stored_pages=stored_pages,
            stored_bytes=stored_bytes,
            errors=dict(errors),
        )


@runtime_checkable
class PageStore(Protocol):
    """A store of host-pool pages addressed by page keys (see the module docstring)."""

    def register_host_pool(self, host: KVHostPool) -> None:
        """Bind the host pool whose pages this store moves (registers its memory)."""
        ...

    def batch_exists(self, keys: Sequence[str]) -> int:
        """Number of consecutive keys, from the first, stored whole."""
        ...

    def batch_set(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Store page ``i`` (host tokens ``host_indices[i*ps:(i+1)*ps]``) under ``keys[i]``."""
        ...

    def batch_get(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Read ``keys[i]`` into host tokens ``host_indices[i*ps:(i+1)*ps]``."""
        ...

    def clear(self) -> None:
        """Remove every page this store can reach."""
        ...

    def stats(self) -> PageStoreStats:
        """A snapshot of the counters."""
        ...
