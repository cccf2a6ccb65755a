"""The :class:`PageStore` contract and its statistics record.

Backend authors: a page store moves whole host-pool pages (HiCache L2) to a
third tier and back. It never touches a device. It sees the host pool only
through the L3 helpers of :class:`sgl_core.MLAHostPool` (or ``MHAHostPool``):

* ``get_page_buffer_meta(indices)`` gives, for whole aligned pages, the
  address and size of each memory *object* of each page, page after page;
  the objects of one page, concatenated, are ``get_data_page(start)``. The
  number of objects per page follows the layout (one per page for page-first
  layouts, one per layer for ``layer_first``, k/v/index_k/scale for
  ``page_first_kv_split``) and is derived from the lengths, so every backend's
  pool works unchanged.
* ``get_contiguous_buf_infos()`` gives the pool's buffers, for zero-copy
  registration with a transfer engine.

Semantics every store keeps (checked by ``tests/l3/test_l3_conformance.py``
and ``tests/l3/test_l3_faults.py``):

* **A hit is exactly one committed write of the page, by a pool that can
  read it.** Stores file each page under its key and the
  :class:`~sgl_core.l3.PageFormat` of the pool that stored it (layout byte
  order, dtype, dims, page size, layers, indexer parts, ...). A pool of
  another format gets a miss and never reads, overwrites or removes those
  pages. A page is published whole, so concurrent writers of one key leave
  one writer's page, never a mix of objects of both.
* ``batch_exists(keys)`` counts consecutive keys, from the first, whose page
  is stored whole; with chained keys (:func:`page_keys`) that is the cached
  prefix length in pages.
* ``batch_set``/``batch_get`` take one page per key; ``host_indices`` are
  token indices of whole pages, ``page_size`` per key, in key order, checked
  like a transfer's indices (an int64 tensor or a sequence of ints; in range;
  whole aligned pages; no host page twice). They return one bool per key. A
  page already stored whole is not written again.
* A page counts as read only if all its bytes arrived whole and verified.
  A page whose read fails leaves its host slots as they were.
* Failures of the store (missing, corrupt, full, unreachable, an I/O error)
  are ``False`` results and counted in :meth:`PageStore.stats`; misuse
  raises ``sgl_core.l3`` errors before any byte moves.

A host pool whose rows mean more than the MLA fields (MHA heads, fp8 rows
with scales, ...) declares it with ``page_format_fields()`` (see
:mod:`sgl_core.l3._format`).
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
