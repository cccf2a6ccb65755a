"""The :class:`PageStore` contract: its calls, statistics record and errors.

The semantics every store keeps are docs/design.md section 8 ("Contract"),
checked by ``tests/l3/test_l3_conformance.py`` and ``tests/l3/test_l3_faults.py``.
A bad host index raises a class that is both a :class:`PageStoreArgumentError`
and the host pools' error for that fault (:data:`HOST_INDEX_ERRORS`), so
either ``except`` clause catches it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from sgl_core.errors import (
    DeviceError,
    DuplicateIndexError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    PageAlignmentError,
    SGLError,
)
from sgl_core.kv.protocols._kv_protocols import KVHostPool

__all__ = [
    "HOST_INDEX_ERRORS",
    "HostIndexAlignmentError",
    "HostIndexDTypeError",
    "HostIndexDeviceError",
    "HostIndexDuplicateError",
    "HostIndexRangeError",
    "HostIndexShapeError",
    "MooncakeSetupError",
    "MooncakeUnavailableError",
    "PageStore",
    "PageStoreArgumentError",
    "PageStoreError",
    "PageStoreNotReadyError",
    "PageStoreRootError",
    "PageStoreRootInUseError",
    "PageStoreStats",
]


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


class PageStoreError(SGLError, RuntimeError):
    """Base class of the runtime errors of an L3 page store."""


class PageStoreArgumentError(SGLError, ValueError):
    """Keys and host indices that do not pair up as whole pages, one page per key."""


class PageStoreNotReadyError(PageStoreError):
    """A transfer before :meth:`PageStore.register_host_pool`, or after ``close()``."""


class PageStoreRootError(PageStoreError):
    """A :class:`~sgl_core.l3.FilePageStore` root that cannot be created or is not a directory."""


class PageStoreRootInUseError(PageStoreRootError):
    """A root held by another live store: a bounded store needs it alone (one capacity)."""


class MooncakeUnavailableError(PageStoreError):
    """The Mooncake client cannot be imported.

    Install it with ``pip install './packages/core[mooncake]'`` (and libibverbs1).
    """


class MooncakeSetupError(PageStoreError):
    """``MooncakeDistributedStore.setup`` or ``register_buffer`` returned an error code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class HostIndexDTypeError(PageStoreArgumentError, IndexDTypeError):
    """``host_indices`` is not an int64 tensor or a sequence of ints (floats, bools, str)."""


class HostIndexShapeError(PageStoreArgumentError, IndexShapeError):
    """``host_indices`` is not 1-D."""


class HostIndexRangeError(PageStoreArgumentError, IndexOutOfRangeError):
    """``host_indices`` holds a token outside the host pool."""


class HostIndexDuplicateError(PageStoreArgumentError, DuplicateIndexError):
    """``host_indices`` names a host token (so a host page) twice in one call."""


class HostIndexAlignmentError(PageStoreArgumentError, PageAlignmentError):
    """``host_indices`` is not whole, aligned pages."""


class HostIndexDeviceError(PageStoreArgumentError, DeviceError):
    """``host_indices`` is a tensor whose values cannot be read (``meta``)."""


#: The host pools' index error -> its L3 twin (raised in its place).
HOST_INDEX_ERRORS: dict[type[SGLError], type[PageStoreArgumentError]] = {
    IndexDTypeError: HostIndexDTypeError,
    IndexShapeError: HostIndexShapeError,
    IndexOutOfRangeError: HostIndexRangeError,
    DuplicateIndexError: HostIndexDuplicateError,
    PageAlignmentError: HostIndexAlignmentError,
    DeviceError: HostIndexDeviceError,
}
