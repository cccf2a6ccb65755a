"""Errors of the L3 page stores, all :class:`sgl_core.errors.SGLError` subclasses.

Per-page outcomes (a miss, a failed transfer, a full store, a store that is
down) are *results* (``False`` / a shorter prefix), never exceptions. These
classes are raised for misuse and for configuration that cannot work.
"""

from __future__ import annotations

from sgl_core.errors import SGLError

__all__ = [
    "MooncakeSetupError",
    "MooncakeUnavailableError",
    "PageStoreArgumentError",
    "PageStoreError",
    "PageStoreNotReadyError",
]


class PageStoreError(SGLError, RuntimeError):
    """Base class of the runtime errors of an L3 page store."""


class PageStoreArgumentError(SGLError, ValueError):
    """Keys and host indices that do not pair up as whole pages, one page per key."""


class PageStoreNotReadyError(PageStoreError):
    """A transfer before :meth:`PageStore.register_host_pool`, or after ``close()``."""


class MooncakeUnavailableError(PageStoreError):
    """The Mooncake client cannot be imported (install ``sgl-core[mooncake]``, libibverbs1)."""


class MooncakeSetupError(PageStoreError):
    """``MooncakeDistributedStore.setup`` or ``register_buffer`` returned an error code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
