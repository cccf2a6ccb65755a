"""``MooncakePageStore``: host-pool pages in the Mooncake distributed store.

Each page is **one** Mooncake object, keyed ``"<page key>#sglpg2.<format
fingerprint>"`` (see :func:`mooncake_key`): a
:class:`~sgl_core.l3._record.PageHeader` followed by the page's memory
objects (see :mod:`sgl_core.l3._protocol`). Transfers are zero-copy: the host
pool's buffers and a small header scratch are registered with
``register_buffer``, and a page moves with one multi-buffer put/get straight
from/to host memory.

* **Page format identity.** The key carries the
  :class:`~sgl_core.l3.PageFormat` fingerprint of the pool that stored the
  page, so a pool of another format sees another key: a miss, never a read,
  overwrite or removal of the first pool's pages.
* **Whole-page commits.** Mooncake publishes an object only once it is
  complete and keeps the first object put under a key, so two writers of one
  key leave one writer's whole page, never a mix; a reader also checks the
  header (format, key, length) and the byte count of what arrived.
* **Verified payloads** (``verify_checksum``, default on). A read that is in
  flight when its object is removed by force (:meth:`MooncakePageStore.remove`,
  ``clear()``, another reader dropping a corrupt page) or when the master
  restarts can copy from a range Mooncake has already handed to another put:
  the header is still the page's, the payload partly another object's. Each
  page therefore carries the CRC-32 of its bytes, checked after every read;
  a mismatch is a miss (and the page is removed). It costs one CRC pass over
  the page per set and per get. With it off, such a read is a wrong hit.
* ``batch_exists``: one ``batch_is_exist`` over the page objects.
* ``batch_set``: pages that already exist are skipped; the rest are put in
  one call.
* ``batch_get``: only pages whose object exists are fetched, so a missing
  page never writes a byte. With ``restore_on_failed_get`` (default) the
  fetched pages' host bytes are saved first and put back for any page whose
  transfer then fails (``TRANSFER_FAIL``, ``LEASE_EXPIRED``, a master lost
  mid-call, a header that does not match): a failed page leaves its host
  slots exactly as they were, at the cost of one memory copy per page read.
  Turn it off when the caller treats a failed page's slots as garbage anyway
  (e.g. freshly allocated prefetch slots).
* The store being down (``RPC_FAIL`` and friends) is a ``False`` / ``0``
  result and a log line, never an exception; Mooncake's client reconnects and
  calls work again once the master is back. Setup and registration failures
  raise :class:`~sgl_core.l3.MooncakeSetupError`.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import logging
import threading
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from sgl_core._protocols import MLAHostPool
from sgl_core.l3._errors import (
    MooncakeSetupError,
    PageStoreArgumentError,
    PageStoreNotReadyError,
)
from sgl_core.l3._format import PageFormat, page_format
from sgl_core.l3._mooncake_lib import (
    OBJECT_ALREADY_EXISTS,
    StoreClient,
    error_name,
)
from sgl_core.l3._pages import Page, check_keys, resolve_pages
from sgl_core.l3._protocol import PageStoreStats
from sgl_core.l3._record import HEADER_SIZE, PageHeader

__all__ = ["MooncakeConfig", "MooncakePageStore", "mooncake_key"]

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_SIZE_MISMATCH = -10  # counted as BUFFER_OVERFLOW: the object is not the expected size
_SCRATCH_PAGES = 64


def _crc32(page: Page) -> int:
    """CRC-32 of the page's objects in host memory, in order."""
    crc = 0
    for ptr, size in zip(page.ptrs, page.sizes, strict=True):
        crc = zlib.crc32(memoryview((ctypes.c_char * size).from_address(ptr)).cast("B"), crc)
    return crc


def mooncake_key(page_key: str, fmt: PageFormat) -> str:
    """The Mooncake object key of ``page_key`` stored by a pool of format ``fmt``."""
    return f"{page_key}#sglpg2.{fmt.fingerprint}"


@dataclasses.dataclass(frozen=True)
class MooncakeConfig:
    """How a :class:`MooncakePageStore` joins a Mooncake store.

    ``master_server_address``: ``host:port`` of ``mooncake_master``.
    ``metadata_server``: ``"P2PHANDSHAKE"`` (no metadata service; default) or
    a metadata URL such as ``"http://127.0.0.1:8080/metadata"``.
    ``local_hostname``: the address peers reach this client at.
    ``global_segment_size``: bytes this process contributes to the shared
    pool (0: a pure client that stores into other processes' segments).
    ``local_buffer_size``: Mooncake's staging buffer, unused by zero-copy
    calls. ``protocol``: ``"tcp"`` (``"rdma"`` with ``rdma_devices``).
    ``verify_checksum``: write and check a CRC-32 of every page (see the
    module docstring); pages written without one are misses for a store
    that checks.
    """

    master_server_address: str = "127.0.0.1:50051"
    metadata_server: str = "P2PHANDSHAKE"
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    rdma_devices: str = ""
    global_segment_size: int = 0
    local_buffer_size: int = 0
    restore_on_failed_get: bool = True
    verify_checksum: bool = True

    def __post_init__(self) -> None:
        for name in ("global_segment_size", "local_buffer_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PageStoreArgumentError(f"{name} must be an int >= 0, got {value!r}")
        if ":" not in self.master_server_address:
            raise PageStoreArgumentError(
                f"master_server_address must be host:port, got {self.master_server_address!r}"
            )
        if self.protocol not in ("tcp", "rdma"):
            raise PageStoreArgumentError(f"protocol must be 'tcp' or 'rdma', got {self.protocol!r}")


class MooncakePageStore:
    """A :class:`~sgl_core.l3.PageStore` on the Mooncake store (see the module docstring)."""

    def __init__(self, config: MooncakeConfig, *, client: Any | None = None) -> None:
        self._config = config
        self._client: StoreClient = client if client is not None else StoreClient()
        rc = self._client.setup(
            local_hostname=config.local_hostname,
            metadata_server=config.metadata_server,
            global_segment_size=config.global_segment_size,
            local_buffer_size=config.local_buffer_size,
            protocol=config.protocol,
            rdma_devices=config.rdma_devices,
            master_server_addr=config.master_server_address,
        )
        if rc != 0:
            raise MooncakeSetupError(
                f"Mooncake setup failed with {error_name(rc)} ({rc}) for master "
                f"{config.master_server_address!r}, metadata {config.metadata_server!r}",
                rc,
            )
        self._lock = threading.Lock()
        self._host: MLAHostPool | None = None
        self._format: PageFormat | None = None
        self._registered: list[int] = []
        # Registered header scratch buffers (one per thread), kept alive until close().
        self._scratch_regs: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._closed = False
        self._tls = threading.local()
        self._counts: collections.Counter[str] = collections.Counter()
        self._errors: collections.Counter[str] = collections.Counter()

    @property
    def config(self) -> MooncakeConfig:
        return self._config

    @property
    def page_format(self) -> PageFormat | None:
        """The registered pool's :class:`~sgl_core.l3.PageFormat` (``None`` before)."""
        return self._format

    # ------------------------------------------------------------------ setup
    def register_host_pool(self, host: MLAHostPool) -> None:
        """Register ``host``'s buffers for zero-copy transfers (replacing a previous pool)."""
        self._check_open()
        fmt = page_format(host)
        bases, totals, _ = host.get_contiguous_buf_infos()
        with self._lock:
            self._unregister()
            for base, total in zip(bases, totals, strict=True):
                rc = self._client.register_buffer(int(base), int(total))
                if rc != 0:
                    self._unregister()
                    raise MooncakeSetupError(
                        f"register_buffer({int(base):#x}, {int(total)}) failed with "
                        f"{error_name(rc)} ({rc})",
                        rc,
                    )
                self._registered.append(int(base))
            self._host = host
            self._format = fmt

    def _unregister(self) -> None:
        for base in self._registered:
            rc = self._client.unregister_buffer(base)
            if rc != 0:
                logger.warning("MooncakePageStore: unregister_buffer(%#x) -> %d", base, rc)
        self._registered.clear()
        self._host = None
        self._format = None

    def _check_open(self) -> None:
        if self._closed:
            raise PageStoreNotReadyError("this MooncakePageStore is closed")

    def _snapshot(self) -> tuple[MLAHostPool | None, PageFormat | None]:
        self._check_open()
        with self._lock:
            return self._host, self._format

    def _header_scratch(self, pages: int) -> int:
        """Address of this thread's registered scratch for ``pages`` page headers."""
        need = pages * HEADER_SIZE
        buf: ctypes.Array[ctypes.c_char] | None = getattr(self._tls, "headers", None)
        if buf is not None and len(buf) >= need:
            return ctypes.addressof(buf)
        new = ctypes.create_string_buffer(max(need, _SCRATCH_PAGES * HEADER_SIZE))
        addr = ctypes.addressof(new)
        with self._lock:
            self._check_open()
            rc = self._client.register_buffer(addr, len(new))
            if rc != 0:
                raise MooncakeSetupError(
                    f"register_buffer of the header scratch failed with {error_name(rc)} ({rc})",
                    rc,
                )
            self._scratch_regs[addr] = new
            if buf is not None:
                old = ctypes.addressof(buf)
                self._client.unregister_buffer(old)
                self._scratch_regs.pop(old, None)
        self._tls.headers = new
        return addr

    def _count_error(self, code: int, n: int = 1) -> None:
        with self._lock:
            self._errors[error_name(code)] += n

    def _call(self, what: str, fn: Any, *args: Any) -> list[int] | None:
        """Run a batch call; an exception from the client becomes ``None`` plus a log line."""
        try:
            result: list[int] = fn(*args)
        except Exception as exc:  # the native client may raise on a lost connection
            logger.warning("MooncakePageStore: %s raised %r", what, exc)
            with self._lock:
                self._errors["exception"] += 1
            return None
        return result

    def _exist_codes(self, obj_keys: list[str]) -> list[int] | None:
        codes = self._call("batch_is_exist", self._client.batch_is_exist, obj_keys)
        if codes is None:
            return None
        bad = [c for c in codes if c < 0]
        for c in set(bad):
            self._count_error(c, bad.count(c))
        if bad:
            logger.warning(
                "MooncakePageStore: batch_is_exist failed for %d of %d objects (%s)",
                len(bad),
                len(codes),
                error_name(bad[0]),
            )
        return codes

    # -------------------------------------------------------------- transfers
    def batch_exists(self, keys: Sequence[str]) -> int:
        """Consecutive keys, from the first, whose page object is in the store."""
        key_list = check_keys(keys)
        host, fmt = self._snapshot()
        if host is None or fmt is None:
            raise PageStoreNotReadyError("call register_host_pool(host) before batch_exists")
        if not key_list:
            return 0
        codes = self._exist_codes([mooncake_key(k, fmt) for k in key_list])
        if codes is None:
            return 0
        hits = 0
        for c in codes:
            if c != 1:
                break
            hits += 1
        return hits

    def batch_set(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Put each missing page whole from host memory; True where the page is stored."""
        host, fmt = self._snapshot()
        pages = resolve_pages(host, fmt, keys, host_indices)
        assert fmt is not None  # resolve_pages raised otherwise
        if not pages:
            return []
        mkeys = [mooncake_key(p.key, fmt) for p in pages]
        codes = self._exist_codes(mkeys)
        if codes is None or all(c < 0 for c in codes):
            # The store cannot answer: do not push bytes into it blindly.
            with self._lock:
                self._counts["pages_set_failed"] += len(pages)
            return [False] * len(pages)
        ok = [c == 1 for c in codes]
        todo = [i for i, c in enumerate(codes) if c != 1]
        if todo:
            scratch = self._header_scratch(len(todo))
            headers = memoryview((ctypes.c_char * (len(todo) * HEADER_SIZE)).from_address(scratch))
            verify = self._config.verify_checksum
            for t, i in enumerate(todo):
                crc = _crc32(pages[i]) if verify else None
                header = PageHeader.new(fmt.digest, pages[i].key, pages[i].nbytes, crc)
                header.pack_into(headers.cast("B"), t * HEADER_SIZE)
            put = self._call(
                "batch_put_from_multi_buffers",
                self._client.batch_put_from_multi_buffers,
                [mkeys[i] for i in todo],
                [[scratch + t * HEADER_SIZE, *pages[i].ptrs] for t, i in enumerate(todo)],
                [[HEADER_SIZE, *pages[i].sizes] for i in todo],
            )
            for i, rc in zip(todo, put if put is not None else [-1] * len(todo), strict=True):
                if rc in (0, OBJECT_ALREADY_EXISTS):
                    ok[i] = True
                else:
                    self._count_error(rc)
        results = []
        with self._lock:
            for i, page in enumerate(pages):
                results.append(ok[i])
                if ok[i]:
                    self._counts["pages_set"] += 1
                    if codes[i] == 1:
                        self._counts["pages_skipped"] += 1
                    else:
                        self._counts["bytes_set"] += page.nbytes
                else:
                    self._counts["pages_set_failed"] += 1
        return results

    def batch_get(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Read whole pages into host memory; a failed page leaves its host bytes unchanged."""
        host, fmt = self._snapshot()
        pages = resolve_pages(host, fmt, keys, host_indices)
        assert fmt is not None  # resolve_pages raised otherwise
        if not pages:
            return []
        mkeys = [mooncake_key(p.key, fmt) for p in pages]
        codes = self._exist_codes(mkeys)
        present = [codes is not None and codes[i] == 1 for i in range(len(pages))]
        if codes is not None:
            missing = sum(1 for c in codes if c == 0)
            if missing:
                with self._lock:
                    self._errors["OBJECT_NOT_FOUND"] += missing
        fetch = [i for i, here in enumerate(present) if here]
        fetched_ok: dict[int, bool] = {}
        if fetch:
            scratch = self._header_scratch(len(fetch))
            saved = (
                self._save([pages[i] for i in fetch])
                if self._config.restore_on_failed_get
                else None
            )
            got = self._call(
                "batch_get_into_multi_buffers",
                self._client.batch_get_into_multi_buffers,
                [mkeys[i] for i in fetch],
                [[scratch + f * HEADER_SIZE, *pages[i].ptrs] for f, i in enumerate(fetch)],
                [[HEADER_SIZE, *pages[i].sizes] for i in fetch],
            )
            view = memoryview((ctypes.c_char * (len(fetch) * HEADER_SIZE)).from_address(scratch))
            bad_keys = []
            for f, i in enumerate(fetch):
                page = pages[i]
                rc = got[f] if got is not None else -1
                whole = rc == HEADER_SIZE + page.nbytes
                if not whole:
                    self._count_error(rc if rc < 0 else _SIZE_MISMATCH)
                else:
                    raw = view[f * HEADER_SIZE : (f + 1) * HEADER_SIZE].cast("B")
                    header = PageHeader.unpack(raw)
                    verify = self._config.verify_checksum
                    problem = (
                        "bad magic"
                        if header is None
                        else header.problem(fmt.digest, page.key, page.nbytes, need_crc=verify)
                    )
                    if (
                        problem is None
                        and verify
                        and header is not None
                        and _crc32(page) != header.crc32
                    ):
                        problem = "checksum mismatch"
                    if problem is not None:
                        whole = False
                        logger.warning(
                            "MooncakePageStore: page %r is corrupt (%s); removing it",
                            page.key,
                            problem,
                        )
                        with self._lock:
                            self._errors["corrupt"] += 1
                        bad_keys.append(mkeys[i])
                fetched_ok[i] = whole
                if not whole and saved is not None:
                    self._restore(page, saved)
            if bad_keys:
                # Forced: this read holds a lease on them. A concurrent reader of
                # one of them fails its own header check (or its transfer).
                self._call("batch_remove", self._client.batch_remove, bad_keys, True)
        results = [fetched_ok.get(i, False) for i in range(len(pages))]
        with self._lock:
            for page, whole in zip(pages, results, strict=True):
                if whole:
                    self._counts["pages_get"] += 1
                    self._counts["bytes_get"] += page.nbytes
                else:
                    self._counts["pages_get_failed"] += 1
        return results

    def _save(self, pages: list[Page]) -> dict[int, int]:
        """Save the pages' host bytes in this thread's scratch; ``{ptr: scratch address}``."""
        need = sum(p.nbytes for p in pages)
        scratch: ctypes.Array[ctypes.c_char] | None = getattr(self._tls, "buf", None)
        if scratch is None or len(scratch) < need:
            scratch = ctypes.create_string_buffer(need)
            self._tls.buf = scratch
        base = ctypes.addressof(scratch)
        where: dict[int, int] = {}
        off = 0
        for page in pages:
            for ptr, size in zip(page.ptrs, page.sizes, strict=True):
                ctypes.memmove(base + off, ptr, size)
                where[ptr] = base + off
                off += size
        return where

    @staticmethod
    def _restore(page: Page, saved: dict[int, int]) -> None:
        for ptr, size in zip(page.ptrs, page.sizes, strict=True):
            ctypes.memmove(ptr, saved[ptr], size)

    # ------------------------------------------------------------ management
    def remove(self, keys: Sequence[str]) -> int:
        """Remove the pages of ``keys`` stored in this pool's format (forcing past read leases).

        Returns how many pages were removed. A read of one of them in flight
        may then fail (a miss); it never returns bytes of another page.
        """
        key_list = check_keys(keys)
        _, fmt = self._snapshot()
        if fmt is None:
            raise PageStoreNotReadyError("call register_host_pool(host) before remove")
        if not key_list:
            return 0
        codes = self._call(
            "batch_remove",
            self._client.batch_remove,
            [mooncake_key(k, fmt) for k in key_list],
            True,
        )
        return sum(1 for c in codes or [] if c == 0)

    def clear(self) -> None:
        """Remove **every** object in the Mooncake store (it is shared: all namespaces)."""
        self._check_open()
        rc = self._client.remove_all(True)
        if rc < 0:
            logger.warning("MooncakePageStore: remove_all -> %s (%d)", error_name(rc), rc)
            self._count_error(rc)

    def stats(self) -> PageStoreStats:
        with self._lock:
            c = self._counts
            return PageStoreStats(
                pages_set=c["pages_set"],
                pages_set_failed=c["pages_set_failed"],
                pages_skipped=c["pages_skipped"],
                pages_get=c["pages_get"],
                pages_get_failed=c["pages_get_failed"],
                bytes_set=c["bytes_set"],
                bytes_get=c["bytes_get"],
                evicted_pages=0,
                stored_pages=None,
                stored_bytes=None,
                errors=dict(self._errors),
            )

    def close(self) -> None:
        """Unregister the host pool's buffers and leave the store (idempotent)."""
        if self._closed:
            return
        with self._lock:
            self._unregister()
            for addr in self._scratch_regs:
                self._client.unregister_buffer(addr)
            self._scratch_regs.clear()
            self._closed = True
        rc = self._client.close()
        if rc != 0:
            logger.warning("MooncakePageStore: close -> %s (%d)", error_name(rc), rc)

    def __enter__(self) -> MooncakePageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
