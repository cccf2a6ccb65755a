"""``FilePageStore``: the embedded L3 default, one file per page (docs/design.md section 8).

A bad file is a miss, counted as ``"corrupt"`` and deleted (only if it is
still the file that was read). Files of the old ``<root>/objects/`` format
are neither read nor counted. Page bytes are read and written outside the store lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch

from sgl_core.kv.protocols._kv_protocols import KVHostPool
from sgl_core.l3._file_disk import fsync_dir
from sgl_core.l3._file_index import FileIndex
from sgl_core.l3._format import PageFormat, page_format
from sgl_core.l3._pages import Page, check_keys
from sgl_core.l3._record import HEADER_SIZE, PageHeader

__all__ = ["FilePageStore"]

logger = logging.getLogger(__name__)


class FilePageStore(FileIndex):
    """A :class:`~sgl_core.l3.PageStore` in a local directory (see the module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        capacity_bytes: int | None = None,
        *,
        fsync: bool = False,
    ) -> None:
        self._fsync = fsync
        super().__init__(root, capacity_bytes)

    def register_host_pool(self, host: KVHostPool) -> None:
        """Bind ``host``; its :class:`PageFormat` selects which stored pages it can read."""
        fmt = page_format(host)
        with self._lock:
            self._host = host
            self._format = fmt

    def _path(self, page_key: str) -> Path:
        """The file of ``page_key`` for the registered pool's format (tests and tools)."""
        return self._file(self._name(self._ready("locating a page file"), page_key))

    def _whole(self, name: str, size: int) -> bool:
        """Whether page file ``name`` is on disk at its full ``size``."""
        try:
            return self._file(name).stat().st_size == size
        except OSError:
            return False

    def batch_exists(self, keys: Sequence[str]) -> int:
        """Consecutive keys, from the first, whose page file is on disk whole (by size)."""
        key_list = check_keys(keys)
        fmt = self._ready("batch_exists")
        want = HEADER_SIZE + fmt.page_bytes
        return next(
            (i for i, k in enumerate(key_list) if not self._whole(self._name(fmt, k), want)),
            len(key_list),
        )

    def batch_set(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Write each page whole (skipping pages already whole on disk); one bool per key."""
        fmt, pages = self._resolve(keys, host_indices)
        ok, moved = [], []
        for page in pages:
            name = self._name(fmt, page.key)
            skip = self._whole(name, HEADER_SIZE + page.nbytes)
            if skip:
                self._adopt(name)
            ok.append(skip or self._set_page(fmt, page, name))
            moved.append(not skip)
        return self._tally("set", pages, ok, moved)

    def _set_page(self, fmt: PageFormat, page: Page, name: str) -> bool:
        """Write the page to a locked temp file and rename it into place; True once committed.

        The commit (rename plus index update) runs under the store lock, so
        ``clear()`` and eviction see a page either before or after it.
        """
        size = HEADER_SIZE + page.nbytes
        with self._lock:
            if not self._make_room(size, protect=name):
                self._errors["no_space"] += 1
                return False
            self._reserved += size
        path = self._file(name)
        committed = False
        try:
            fd, tmp = self._open_tmp(name)
            try:
                views = page.views()
                header = PageHeader.new(fmt.digest, page.key, page.nbytes, page.crc32(views))
                for whole in [memoryview(header.pack()), *views]:
                    view = whole
                    while view.nbytes:  # os.write may write less than asked
                        view = view[os.write(fd, view) :]
                if self._fsync:
                    os.fsync(fd)
                path.parent.mkdir(exist_ok=True)
                with self._lock:
                    os.replace(tmp, path)
                    self._forget(name)
                    self._lru[name] = size
                    self._committed += size
                    self._reserved -= size
                    committed = True
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
            finally:
                with self._lock:
                    self._own_tmp.discard(tmp)
                os.close(fd)
            if self._fsync:
                fsync_dir(path.parent)
        except OSError as exc:
            logger.warning("FilePageStore: writing page %r failed: %s", page.key, exc)
            self._error("io_error")
        finally:
            if not committed:
                with self._lock:
                    self._reserved -= size
        return committed

    def _read_page(self, fmt: PageFormat, page: Page, name: str) -> int | None:
        """Read and verify the page file into this thread's staging buffer; its address or None."""
        path = self._file(name)
        want = HEADER_SIZE + page.nbytes
        base = self._thread_buffer(want)
        view = memoryview((ctypes.c_char * want).from_address(base)).cast("B")
        got = 0
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                if st.st_size == want:
                    while got < want and (n := f.readinto(view[got:])):
                        got += n
        except FileNotFoundError:
            with self._lock:
                self._errors["missing"] += 1
                self._forget(name)  # removed behind this store's back
            return None
        except OSError as exc:
            logger.warning("FilePageStore: reading %s failed: %s", path, exc)
            self._error("io_error")
            return None
        if st.st_size != want:
            problem: str | None = f"length {st.st_size} != {want}"
        elif got != want:
            problem = f"short read: {got} of {want} bytes"
        else:
            problem = PageHeader.check(
                view, fmt.digest, page.key, page.nbytes, lambda: zlib.crc32(view[HEADER_SIZE:])
            )
        if problem is not None:
            self._drop_corrupt(page.key, name, st, problem)
            return None
        return base

    def batch_get(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Read and verify each page whole, then copy it into the host pool; one bool per key."""
        fmt, pages = self._resolve(keys, host_indices)
        ok = []
        for page in pages:
            name = self._name(fmt, page.key)
            base = self._read_page(fmt, page, name)
            if base is not None:
                page.move(base + HEADER_SIZE, into=True)
                self._adopt(name)
            ok.append(base is not None)
        return self._tally("get", pages, ok)
