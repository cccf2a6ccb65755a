"""Errors of the L3 page stores, all :class:`sgl_core.errors.SGLError` subclasses.

Per-page outcomes (miss, failed transfer, full or down store) are results,
never exceptions; these are raised for misuse and unworkable configuration
before any byte moves. A bad host index raises a class that is both a
:class:`PageStoreArgumentError` and the host pools' error for that fault
(:class:`~sgl_core.errors.IndexDTypeError`, ``IndexShapeError``,
``IndexOutOfRangeError``, ``DuplicateIndexError``, ``PageAlignmentError``),
so either ``except`` clause catches it.
"""

from __future__ import annotations

from sgl_core.errors import (
    DeviceError,
    DuplicateIndexError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    PageAlignmentError,
    SGLError,
)

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
    "PageStoreArgumentError",
    "PageStoreError",
    "PageStoreNotReadyError",
    "PageStoreRootError",
    "PageStoreRootInUseError",
]


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
