"""``MooncakePageStore``: host-pool pages in the Mooncake distributed store.

Each page object (see :mod:`sgl_core.l3._protocol`) is one Mooncake object
keyed ``"<page key>#<j>of<n>"``. Transfers are zero-copy: the host pool's
buffers are registered with ``register_buffer`` and objects move with
``batch_put_from`` / ``batch_get_into`` straight from/to host memory.

* ``batch_exists``: one ``batch_is_exist`` over every object of the keys.
* ``batch_set``: objects that already exist are skipped; the rest are put in
  one call. A page succeeds when all of its objects are in the store.
* ``batch_get``: only pages whose objects all exist are fetched, so a missing
  or half-stored page never writes a byte. With ``restore_on_failed_get``
  (default) the fetched pages' host bytes are saved first and put back for any
  page whose transfer then fails (``TRANSFER_FAIL``, ``LEASE_EXPIRED``, a
  master lost mid-call): a failed page leaves its host slots exactly as they
  were, at the cost of one memory copy per page read. Turn it off when the
  caller treats a failed page's slots as garbage anyway (e.g. freshly
  allocated prefetch slots).
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
from collections.abc import Sequence
from typing import Any

import torch

from sgl_core._protocols import MLAHostPool
from sgl_core.l3._errors import (
    MooncakeSetupError,
    PageStoreArgumentError,
    PageStoreNotReadyError,
)
from sgl_core.l3._mooncake_lib import (
    OBJECT_ALREADY_EXISTS,
    StoreClient,
    error_name,
)
from sgl_core.l3._pages import PageObjects, check_keys, object_key, objects_per_page, resolve_pages
from sgl_core.l3._protocol import PageStoreStats

__all__ = ["MooncakeConfig", "MooncakePageStore"]

logger = logging.getLogger(__name__)

_MIB = 1 << 20


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
    """

    master_server_address: str = "127.0.0.1:50051"
    metadata_server: str = "P2PHANDSHAKE"
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    rdma_devices: str = ""
    global_segment_size: int = 0
    local_buffer_size: int = 0
    restore_on_failed_get: bool = True

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
        self._n_objects = 0
        self._registered: list[int] = []
        self._closed = False
        self._scratch = threading.local()
        self._counts: collections.Counter[str] = collections.Counter()
        self._errors: collections.Counter[str] = collections.Counter()

    @property
    def config(self) -> MooncakeConfig:
        return self._config

    # ------------------------------------------------------------------ setup
    def register_host_pool(self, host: MLAHostPool) -> None:
        """Register ``host``'s buffers for zero-copy transfers (replacing a previous pool)."""
        self._check_open()
        n = objects_per_page(host)
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
            self._n_objects = n

    def _unregister(self) -> None:
        for base in self._registered:
            rc = self._client.unregister_buffer(base)
            if rc != 0:
                logger.warning("MooncakePageStore: unregister_buffer(%#x) -> %d", base, rc)
        self._registered.clear()
        self._host = None

    def _check_open(self) -> None:
        if self._closed:
            raise PageStoreNotReadyError("this MooncakePageStore is closed")

    def _snapshot(self) -> tuple[MLAHostPool | None, int]:
        self._check_open()
        with self._lock:
            return self._host, self._n_objects

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
        """Consecutive keys, from the first, with every object in the store."""
        key_list = check_keys(keys)
        host, n = self._snapshot()
        if host is None:
            raise PageStoreNotReadyError("call register_host_pool(host) before batch_exists")
        if not key_list:
            return 0
        obj_keys = [object_key(k, j, n) for k in key_list for j in range(n)]
        codes = self._exist_codes(obj_keys)
        if codes is None:
            return 0
        hits = 0
        for p in range(len(key_list)):
            if not all(c == 1 for c in codes[p * n : (p + 1) * n]):
                break
            hits += 1
        return hits

    def batch_set(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Put each page's missing objects from host memory; True where the page is stored whole."""
        host, n = self._snapshot()
        pages = resolve_pages(host, n, keys, host_indices)
        if not pages:
            return []
        obj_keys = [k for p in pages for k in p.object_keys]
        codes = self._exist_codes(obj_keys)
        if codes is None or all(c < 0 for c in codes):
            # The store cannot answer: do not push bytes into it blindly.
            with self._lock:
                self._counts["pages_set_failed"] += len(pages)
            return [False] * len(pages)
        ok = [c == 1 for c in codes]
        todo = [i for i, c in enumerate(codes) if c != 1]
        if todo:
            ptrs = [p.ptrs[j] for p in pages for j in range(n)]
            sizes = [p.sizes[j] for p in pages for j in range(n)]
            put = self._call(
                "batch_put_from",
                self._client.batch_put_from,
                [obj_keys[i] for i in todo],
                [ptrs[i] for i in todo],
                [sizes[i] for i in todo],
            )
            for i, rc in zip(todo, put if put is not None else [-1] * len(todo), strict=True):
                if rc in (0, OBJECT_ALREADY_EXISTS):
                    ok[i] = True
                else:
                    self._count_error(rc)
        results = []
        with self._lock:
            for p, page in enumerate(pages):
                whole = all(ok[p * n : (p + 1) * n])
                results.append(whole)
                if whole:
                    self._counts["pages_set"] += 1
                    if all(codes[p * n + j] == 1 for j in range(n)):
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
        host, n = self._snapshot()
        pages = resolve_pages(host, n, keys, host_indices)
        if not pages:
            return []
        obj_keys = [k for p in pages for k in p.object_keys]
        codes = self._exist_codes(obj_keys)
        present = [
            codes is not None and all(c == 1 for c in codes[p * n : (p + 1) * n])
            for p in range(len(pages))
        ]
        if codes is not None:
            missing = sum(1 for c in codes if c == 0)
            if missing:
                with self._lock:
                    self._errors["OBJECT_NOT_FOUND"] += missing
        fetch = [page for page, here in zip(pages, present, strict=True) if here]
        fetched_ok: dict[str, bool] = {}
        if fetch:
            saved = self._save(fetch) if self._config.restore_on_failed_get else None
            got = self._call(
                "batch_get_into",
                self._client.batch_get_into,
                [k for p in fetch for k in p.object_keys],
                [x for p in fetch for x in p.ptrs],
                [x for p in fetch for x in p.sizes],
            )
            for f, page in enumerate(fetch):
                page_codes = got[f * n : (f + 1) * n] if got is not None else [-1] * n
                whole = True
                for rc, size in zip(page_codes, page.sizes, strict=True):
                    if rc != size:
                        whole = False
                        self._count_error(rc if rc < 0 else -10)
                fetched_ok[page.key] = whole
                if not whole and saved is not None:
                    self._restore(page, saved)
        results = [fetched_ok.get(page.key, False) for page in pages]
        with self._lock:
            for page, whole in zip(pages, results, strict=True):
                if whole:
                    self._counts["pages_get"] += 1
                    self._counts["bytes_get"] += page.nbytes
                else:
                    self._counts["pages_get_failed"] += 1
        return results

    def _save(self, pages: list[PageObjects]) -> dict[int, int]:
        """Save the pages' host bytes in this thread's scratch; ``{ptr: scratch address}``."""
        need = sum(p.nbytes for p in pages)
        scratch: ctypes.Array[ctypes.c_char] | None = getattr(self._scratch, "buf", None)
        if scratch is None or len(scratch) < need:
            scratch = ctypes.create_string_buffer(need)
            self._scratch.buf = scratch
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
    def _restore(page: PageObjects, saved: dict[int, int]) -> None:
        for ptr, size in zip(page.ptrs, page.sizes, strict=True):
            ctypes.memmove(ptr, saved[ptr], size)

    # ------------------------------------------------------------ management
    def remove(self, keys: Sequence[str]) -> int:
        """Remove every object of ``keys`` (forcing past read leases); returns objects removed."""
        key_list = check_keys(keys)
        _, n = self._snapshot()
        if n == 0:
            raise PageStoreNotReadyError("call register_host_pool(host) before remove")
        removed = 0
        for key in key_list:
            for j in range(n):
                if self._client.remove(object_key(key, j, n), True) == 0:
                    removed += 1
        return removed

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
            self._closed = True
        rc = self._client.close()
        if rc != 0:
            logger.warning("MooncakePageStore: close -> %s (%d)", error_name(rc), rc)

    def __enter__(self) -> MooncakePageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
