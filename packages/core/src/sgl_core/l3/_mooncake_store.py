"""``MooncakePageStore``: host-pool pages in the Mooncake distributed store.

Keys, record and checksum: docs/design.md section 8 (:func:`mooncake_key`,
:mod:`sgl_core.l3._protocol`). The host buffers and a small header scratch
are registered with ``register_buffer``; a page moves zero-copy with one
multi-buffer put/get. Mooncake keeps the first whole object put under a key,
so concurrent writers leave one writer's page. ``batch_set`` skips pages
that exist; ``batch_get`` fetches only existing pages, so a missing page
writes no byte. With ``restore_on_failed_get`` (default) the fetched pages'
host bytes are saved first and put back for any page whose transfer or
header check fails; turn it off when failed slots are garbage anyway. The
store being down (``RPC_FAIL`` ...) is a ``False`` / ``0`` result and a log
line; setup failures raise :class:`~sgl_core.l3.MooncakeSetupError`.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence

import torch

from sgl_core.l3._errors import PageStoreNotReadyError
from sgl_core.l3._mooncake_client import MooncakeClient
from sgl_core.l3._mooncake_config import MooncakeConfig, mooncake_key
from sgl_core.l3._mooncake_lib import OBJECT_ALREADY_EXISTS, error_name
from sgl_core.l3._mooncake_pages import fetched_problem, pack_headers, restore_page, save_pages
from sgl_core.l3._pages import check_keys, resolve_pages
from sgl_core.l3._protocol import PageStoreStats
from sgl_core.l3._record import HEADER_SIZE

__all__ = ["MooncakeConfig", "MooncakePageStore", "mooncake_key"]

logger = logging.getLogger(__name__)

_SIZE_MISMATCH = -10  # counted as BUFFER_OVERFLOW: the object is not the expected size


class MooncakePageStore(MooncakeClient):
    """A :class:`~sgl_core.l3.PageStore` on the Mooncake store (see the module docstring)."""

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
        return next((i for i, c in enumerate(codes) if c != 1), len(codes))

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
            pack_headers(scratch, fmt, [pages[i] for i in todo], self._config.verify_checksum)
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
                save_pages(self._tls, [pages[i] for i in fetch])
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
                    problem = fetched_problem(raw, fmt, page, self._config.verify_checksum)
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
                    restore_page(page, saved)
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
            # stored pages/bytes: unknown in a shared distributed store
            return PageStoreStats.from_counts(self._counts, self._errors)

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
