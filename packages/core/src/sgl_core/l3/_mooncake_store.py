"""``MooncakePageStore``: host-pool pages in the Mooncake store (docs/design.md section 8).

Mooncake keeps the first whole object put under a key (``_mooncake_lib``), so
concurrent writers leave one writer's page. ``batch_get`` fetches only
existing pages, so a missing page writes no byte; with ``restore_on_failed_get``
the fetched pages' host bytes are saved first and put back on a failed check.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from sgl_core.l3._format import PageFormat
from sgl_core.l3._mooncake_client import MooncakeClient, MooncakeConfig, mooncake_key
from sgl_core.l3._mooncake_lib import OBJECT_ALREADY_EXISTS, error_name
from sgl_core.l3._pages import Page, check_keys
from sgl_core.l3._protocol import PageStoreStats
from sgl_core.l3._record import HEADER_SIZE, PageHeader

__all__ = ["MooncakeConfig", "MooncakePageStore", "mooncake_key"]

logger = logging.getLogger(__name__)

_SIZE_MISMATCH = -10  # counted as BUFFER_OVERFLOW: the object is not the expected size


class MooncakePageStore(MooncakeClient):
    """A :class:`~sgl_core.l3.PageStore` on the Mooncake store (see the module docstring)."""

    # -------------------------------------------------------------- transfers
    def batch_exists(self, keys: Sequence[str]) -> int:
        """Consecutive keys, from the first, whose page object is in the store."""
        key_list = check_keys(keys)
        fmt = self._ready("batch_exists")
        codes = self._exist_codes([mooncake_key(k, fmt) for k in key_list]) or []  # None: failed
        return next((i for i, c in enumerate(codes) if c != 1), len(codes))

    def _prepare(
        self, keys: Sequence[str], host_indices: object
    ) -> tuple[PageFormat, list[Page], list[str], list[int] | None]:
        """The pages of a batch call, their object keys and ``batch_is_exist`` codes."""
        fmt, pages = self._resolve(keys, host_indices)
        mkeys = [mooncake_key(p.key, fmt) for p in pages]
        return fmt, pages, mkeys, self._exist_codes(mkeys)

    def _transfer(
        self, what: str, scratch: int, pages: list[Page], mkeys: list[str], idx: list[int]
    ) -> list[int]:
        """One multi-buffer call for pages ``idx`` (header ``t`` at ``scratch``); -1s if raised."""
        rcs = self._call(
            what,
            [mkeys[i] for i in idx],
            [[scratch + t * HEADER_SIZE, *pages[i].ptrs] for t, i in enumerate(idx)],
            [[HEADER_SIZE, *pages[i].sizes] for i in idx],
        )
        return rcs if rcs is not None else [-1] * len(idx)

    def batch_set(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Put each missing page whole from host memory; True where the page is stored."""
        fmt, pages, mkeys, codes = self._prepare(keys, host_indices)
        if codes is None or all(c < 0 for c in codes):
            # The store cannot answer: do not push bytes into it blindly.
            return self._tally("set", pages, [False] * len(pages))
        ok = [c == 1 for c in codes]
        todo = [i for i, c in enumerate(codes) if c != 1]
        if todo:
            scratch, headers = self._header_scratch(len(todo))
            for t, i in enumerate(todo):
                crc = pages[i].crc32() if self._config.verify_checksum else None
                header = PageHeader.new(fmt.digest, pages[i].key, pages[i].nbytes, crc)
                header.pack_into(headers, t * HEADER_SIZE)
            rcs = self._transfer("batch_put_from_multi_buffers", scratch, pages, mkeys, todo)
            for i, rc in zip(todo, rcs, strict=True):
                if rc in (0, OBJECT_ALREADY_EXISTS):
                    ok[i] = True
                else:
                    self._error(error_name(rc))
        return self._tally("set", pages, ok, [c != 1 for c in codes])

    def batch_get(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Read whole pages into host memory; a failed page leaves its host bytes unchanged."""
        fmt, pages, mkeys, codes = self._prepare(keys, host_indices)
        ok = [False] * len(pages)
        if codes is None:
            return self._tally("get", pages, ok)
        if missing := codes.count(0):
            self._error("OBJECT_NOT_FOUND", missing)
        fetch = [i for i, c in enumerate(codes) if c == 1]
        if fetch:
            saved: dict[int, int] = {}  # page -> its host bytes' copy in this thread's scratch
            if self._config.restore_on_failed_get:
                addr = self._thread_buffer(sum(pages[i].nbytes for i in fetch))
                for i in fetch:
                    pages[i].move(addr, into=False)
                    saved[i] = addr
                    addr += pages[i].nbytes
            scratch, view = self._header_scratch(len(fetch))
            rcs = self._transfer("batch_get_into_multi_buffers", scratch, pages, mkeys, fetch)
            bad_keys = []
            for f, (i, rc) in enumerate(zip(fetch, rcs, strict=True)):
                page = pages[i]
                raw = view[f * HEADER_SIZE : (f + 1) * HEADER_SIZE]
                crc = page.crc32 if self._config.verify_checksum else None
                if rc != HEADER_SIZE + page.nbytes:
                    self._error(error_name(rc if rc < 0 else _SIZE_MISMATCH))
                elif problem := PageHeader.check(raw, fmt.digest, page.key, page.nbytes, crc):
                    logger.warning(
                        "MooncakePageStore: page %r is corrupt (%s); removing it", page.key, problem
                    )
                    self._error("corrupt")
                    bad_keys.append(mkeys[i])
                else:
                    ok[i] = True
                if not ok[i] and i in saved:
                    page.move(saved[i], into=True)
            if bad_keys:
                # Forced: this read holds a lease on them. A concurrent reader of
                # one of them fails its own header check (or its transfer).
                self._call("batch_remove", bad_keys, True)
        return self._tally("get", pages, ok)

    # ------------------------------------------------------------ management
    def remove(self, keys: Sequence[str]) -> int:
        """Remove the pages of ``keys`` stored in this pool's format (forcing past read leases).

        Returns how many pages were removed. A read of one of them in flight
        may then fail (a miss); it never returns bytes of another page.
        """
        key_list = check_keys(keys)
        fmt = self._ready("remove")
        if not key_list:
            return 0
        codes = self._call("batch_remove", [mooncake_key(k, fmt) for k in key_list], True)
        return sum(1 for c in codes or [] if c == 0)

    def clear(self) -> None:
        """Remove **every** object in the Mooncake store (it is shared: all namespaces)."""
        self._check_open()
        rc = self._client.remove_all(True)
        if rc < 0:
            logger.warning("MooncakePageStore: remove_all -> %s (%d)", error_name(rc), rc)
            self._error(error_name(rc))

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
