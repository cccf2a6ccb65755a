"""Resolve ``(keys, host_indices)`` into the memory objects of whole host-pool pages.

Everything here runs before a store moves a byte: a call that raises has
written nothing, read nothing into the host pool, and changed no counter.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from sgl_core.errors import SGLError
from sgl_core.kv._validation import (
    as_index_tensor,
    check_index_bounds,
    check_page_runs,
    check_unique,
)
from sgl_core.kv.protocols._kv_protocols import KVHostPool
from sgl_core.l3._format import PageFormat
from sgl_core.l3._protocol import (
    HOST_INDEX_ERRORS,
    PageStoreArgumentError,
    PageStoreNotReadyError,
)

__all__ = ["Page", "StoreState", "check_keys", "host_index_tensor", "resolve_pages"]


@dataclasses.dataclass(frozen=True)
class Page:
    """One page of a call: its key, host token start, and its objects' addresses and sizes."""

    key: str
    start: int
    ptrs: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def views(self) -> list[memoryview]:
        """The page's objects in host memory, in order (byte views)."""
        return [
            memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")
            for ptr, size in zip(self.ptrs, self.sizes, strict=True)
        ]

    def move(self, addr: int, *, into: bool) -> None:
        """Copy the page's objects to (``into=False``) or from the ``nbytes`` bytes at ``addr``."""
        for ptr, size in zip(self.ptrs, self.sizes, strict=True):
            ctypes.memmove(*((ptr, addr) if into else (addr, ptr)), size)
            addr += size

    def crc32(self, views: list[memoryview] | None = None) -> int:
        """CRC-32 of the page's objects (``views``: :meth:`views`, if already built)."""
        crc = 0
        for view in self.views() if views is None else views:
            crc = zlib.crc32(view, crc)
        return crc


def check_keys(keys: Sequence[str]) -> list[str]:
    """Validate ``keys`` (non-empty, utf-8 encodable strings, no duplicates); return a list."""
    if isinstance(keys, (str, bytes)):
        raise PageStoreArgumentError("keys must be a sequence of str, got one str")
    try:
        out = list(keys)
    except TypeError:
        raise PageStoreArgumentError(
            f"keys must be a sequence of str, got {type(keys).__name__}"
        ) from None
    for k in out:
        if not isinstance(k, str) or not k:
            raise PageStoreArgumentError(f"keys must be non-empty str, got {k!r}")
        try:
            k.encode()
        except UnicodeEncodeError as exc:
            raise PageStoreArgumentError(f"key {k!r} is not encodable as utf-8: {exc}") from None
    dup = [k for k, n in Counter(out).items() if n > 1]
    if dup:
        raise PageStoreArgumentError(f"keys holds duplicates, e.g. {dup[0]!r}")
    return out


_T = TypeVar("_T")


def _checked(check: Callable[..., _T], *args: object) -> _T:
    """Run a ``sgl_core.kv._validation`` check; raise its L3 twin error on failure."""
    try:
        return check(*args)
    except SGLError as exc:
        twin = HOST_INDEX_ERRORS.get(type(exc))
        if twin is None:
            raise
        raise twin(str(exc)) from None


def host_index_tensor(host_indices: object) -> torch.Tensor:
    """``host_indices`` as a 1-D int64 CPU tensor, checked as the host pools'
    ``as_index_tensor`` does (nothing is rounded), raised as L3 twins."""
    tensor = _checked(as_index_tensor, host_indices, "host_indices")
    return tensor.detach().to("cpu")


def resolve_pages(
    host: KVHostPool | None,
    fmt: PageFormat | None,
    keys: Sequence[str],
    host_indices: object,
) -> list[Page]:
    """Pair each key with its page's objects; raise on anything but whole pages, one per key.

    ``host_indices`` is checked like a transfer's: dtype, shape, range
    ``[0, host.size)``, whole aligned pages, no token (so no page) twice.
    """
    if host is None or fmt is None:
        raise PageStoreNotReadyError("call register_host_pool(host) before moving pages")
    key_list = check_keys(keys)
    idx = host_index_tensor(host_indices)
    ps = fmt.page_size
    if idx.numel() != len(key_list) * ps:
        raise PageStoreArgumentError(
            f"host_indices has {idx.numel()} token indices; {len(key_list)} keys need "
            f"{len(key_list) * ps} (page_size={ps}, one page per key)"
        )
    if not key_list:
        return []
    _checked(check_index_bounds, idx, host.size, "host_indices")
    _checked(check_page_runs, idx, ps, "host_indices")
    _checked(check_unique, idx, "host_indices", host.size)
    starts: list[int] = idx[::ps].tolist()
    try:
        ptrs, sizes = host.get_page_buffer_meta(idx)
    except (ValueError, IndexError, TypeError) as exc:
        raise PageStoreArgumentError(f"host_indices: {exc}") from exc
    n = fmt.n_objects
    if len(ptrs) != len(key_list) * n or len(sizes) != len(ptrs):
        raise PageStoreArgumentError(
            f"host.get_page_buffer_meta returned {len(ptrs)} objects for {len(key_list)} pages; "
            f"the registered page format has {n} per page"
        )
    out = []
    for p, key in enumerate(key_list):
        page_sizes = tuple(int(x) for x in sizes[p * n : (p + 1) * n])
        if page_sizes != fmt.object_bytes:
            raise PageStoreArgumentError(
                f"host page at token {starts[p]} has objects of {list(page_sizes)} bytes; "
                f"the registered page format has {list(fmt.object_bytes)}"
            )
        out.append(
            Page(
                key=key,
                start=starts[p],
                ptrs=tuple(int(x) for x in ptrs[p * n : (p + 1) * n]),
                sizes=page_sizes,
            )
        )
    return out


class StoreState:
    """What both page stores share: one lock, the bound pool and its format, the counters."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._host: KVHostPool | None = None
        self._format: PageFormat | None = None
        self._counts: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._tls = threading.local()

    @property
    def page_format(self) -> PageFormat | None:
        """The registered pool's :class:`~sgl_core.l3.PageFormat` (``None`` before)."""
        return self._format

    def _check_open(self) -> None:
        """Raise if the store is closed (only a Mooncake store closes)."""

    def _snapshot(self) -> tuple[KVHostPool | None, PageFormat | None]:
        self._check_open()
        with self._lock:
            return self._host, self._format

    def _ready(self, what: str) -> PageFormat:
        """The registered format; ``PageStoreNotReadyError`` (naming ``what``) before one."""
        _, fmt = self._snapshot()
        if fmt is None:
            raise PageStoreNotReadyError(f"call register_host_pool(host) before {what}")
        return fmt

    def _resolve(self, keys: Sequence[str], host_indices: object) -> tuple[PageFormat, list[Page]]:
        host, fmt = self._snapshot()
        pages = resolve_pages(host, fmt, keys, host_indices)
        assert fmt is not None  # resolve_pages raised otherwise
        return fmt, pages

    def _thread_buffer(self, size: int) -> int:
        """Address of this thread's scratch of at least ``size`` bytes (grown, never shrunk)."""
        buf: ctypes.Array[ctypes.c_char] | None = getattr(self._tls, "buf", None)
        if buf is None or len(buf) < size:
            buf = ctypes.create_string_buffer(size)
            self._tls.buf = buf
        return ctypes.addressof(buf)

    def _error(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._errors[reason] += n

    def _tally(
        self, op: str, pages: list[Page], ok: list[bool], moved: list[bool] | None = None
    ) -> list[bool]:
        """Count ``op`` ("set"/"get") results; ``moved[i]`` False: page ``i`` was already stored."""
        with self._lock:
            for i, (page, hit) in enumerate(zip(pages, ok, strict=True)):
                if not hit:
                    self._counts[f"pages_{op}_failed"] += 1
                    continue
                self._counts[f"pages_{op}"] += 1
                if moved is None or moved[i]:
                    self._counts[f"bytes_{op}"] += page.nbytes
                else:
                    self._counts["pages_skipped"] += 1
        return ok
