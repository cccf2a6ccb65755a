"""``FilePageStore``: the embedded L3 default, a directory of one file per page.

On-disk format: ``<root>/pages/<xx>/<name>``, where ``name`` is
``sha256(format digest | 0x00 | page key)`` in hex and ``xx`` its first two
characters. A file is one :class:`~sgl_core.l3._record.PageHeader` (with
the payload's CRC-32) followed by the page's memory objects, concatenated.

* **Page format identity.** The file name covers the
  :class:`~sgl_core.l3.PageFormat` of the pool that stored the page, so a
  pool of another format (another byte order, dtype, dims, ...) looks at
  another file: a miss, and it never reads, overwrites or deletes the first
  pool's pages. The header repeats the format and key digests.
* **Whole-page commits.** A page is written to ``<root>/tmp/`` and renamed
  into place (``os.replace``): a reader opens one writer's whole page or
  nothing. Two writers of one key with different bytes leave one of the two
  pages, never a mix.
* **Verified reads.** A read checks header, length and CRC-32 of the whole
  file in a staging buffer and copies into the host pool only when all of it
  checks out. A bad file is a miss: logged, counted as ``"corrupt"`` and
  deleted (only if it is still the file that was read), so the page can be
  stored again. (CRC-32 catches storage and truncation faults; it is not a
  defence against a malicious writer.)
* **Capacity.** ``capacity_bytes`` bounds the bytes on disk: page files plus
  temp files being written. Room is reserved before a write; when a page
  does not fit, whole pages are evicted least-recently-used first (a set or
  a get counts as a use). Pages found on disk when the store opens, or
  written by another process sharing the directory, join the LRU order when
  first seen (oldest modification time first) and count from then on.
  ``stats().stored_bytes`` is those bytes; with one store on the directory
  it equals the bytes on disk whenever no call is in flight.
* **Crash leftovers.** A writer holds an exclusive ``flock`` on its temp
  file until the rename. Temp files whose writer is gone (a process killed
  mid-write) are removed when a store opens the directory and by
  ``clear()``; temp files of writers still alive are counted toward the
  capacity until they are gone.
* Files of the earlier one-file-per-object format (``<root>/objects/``) are
  neither read nor counted; delete that folder to reclaim its space.
* One lock guards the index and the counters, and every rename and unlink
  of a page file, so ``clear()``, eviction and commits never interleave
  halfway. Reading and writing page bytes runs outside it: threads (and
  processes sharing the directory) read and write at once.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import re
import threading
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch

from sgl_core._protocols import MLAHostPool
from sgl_core.l3._errors import (
    PageStoreArgumentError,
    PageStoreNotReadyError,
    PageStoreRootError,
)
from sgl_core.l3._format import PageFormat, page_format
from sgl_core.l3._pages import Page, check_keys, resolve_pages
from sgl_core.l3._protocol import PageStoreStats
from sgl_core.l3._record import HEADER_SIZE, PageHeader

__all__ = ["FilePageStore"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[0-9a-f]{64}")
_TMP_SUFFIX = ".tmp"


def _host_view(ptr: int, size: int) -> memoryview:
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


def _check_root(root: object) -> Path:
    if root is None or not isinstance(root, (str, os.PathLike)):
        raise PageStoreArgumentError(
            f"root must be a str or os.PathLike directory path, got {type(root).__name__}"
        )
    text = os.fspath(root)
    if not isinstance(text, str):
        raise PageStoreArgumentError("root must be a str path, not bytes")
    if not text.strip():
        raise PageStoreArgumentError("root must be a directory path, got an empty string")
    if "\x00" in text:
        raise PageStoreArgumentError("root must not contain NUL characters")
    return Path(text)


class FilePageStore:
    """A :class:`~sgl_core.l3.PageStore` in a local directory (see the module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        capacity_bytes: int | None = None,
        *,
        fsync: bool = False,
    ) -> None:
        if capacity_bytes is not None and (
            isinstance(capacity_bytes, bool)
            or not isinstance(capacity_bytes, int)
            or capacity_bytes <= 0
        ):
            raise PageStoreArgumentError(
                f"capacity_bytes must be a positive int or None, got {capacity_bytes!r}"
            )
        self._root = _check_root(root)
        self._pages = self._root / "pages"
        self._tmp = self._root / "tmp"
        try:
            self._pages.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
        except (OSError, UnicodeEncodeError) as exc:
            raise PageStoreRootError(
                f"cannot use {str(self._root)!r} as an L3 root: {exc}"
            ) from exc
        self._capacity = capacity_bytes
        self._fsync = fsync
        self._lock = threading.RLock()
        # name -> file bytes, least recently used first: pages this store knows are on disk.
        self._lru: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._committed = 0  # sum of self._lru
        self._reserved = 0  # this store's writes in flight (temp files)
        self._foreign_tmp: dict[Path, int] = {}  # temp files of other live writers
        self._own_tmp: set[Path] = set()  # this store's temp files (counted in _reserved)
        self._host: MLAHostPool | None = None
        self._format: PageFormat | None = None
        self._counts: collections.Counter[str] = collections.Counter()
        self._errors: collections.Counter[str] = collections.Counter()
        self._staging = threading.local()
        self._scan()

    # ------------------------------------------------------------------ setup
    @property
    def root(self) -> Path:
        return self._root

    @property
    def capacity_bytes(self) -> int | None:
        return self._capacity

    @property
    def page_format(self) -> PageFormat | None:
        """The registered pool's :class:`PageFormat` (``None`` before registration)."""
        return self._format

    def register_host_pool(self, host: MLAHostPool) -> None:
        """Bind ``host``; its :class:`PageFormat` selects which stored pages it can read."""
        fmt = page_format(host)
        with self._lock:
            self._host = host
            self._format = fmt

    def _name(self, fmt: PageFormat, page_key: str) -> str:
        return hashlib.sha256(fmt.digest + b"\x00" + page_key.encode()).hexdigest()

    def _file(self, name: str) -> Path:
        return self._pages / name[:2] / name

    def _path(self, page_key: str) -> Path:
        """The file of ``page_key`` for the registered pool's format (tests and tools)."""
        with self._lock:
            fmt = self._format
        if fmt is None:
            raise PageStoreNotReadyError("call register_host_pool(host) first")
        return self._file(self._name(fmt, page_key))

    def _snapshot(self) -> tuple[MLAHostPool | None, PageFormat | None]:
        with self._lock:
            return self._host, self._format

    # ---------------------------------------------------------- scan/reclaim
    def _scan(self) -> None:
        found: list[tuple[float, str, int]] = []
        with contextlib.suppress(OSError):
            for shard in os.scandir(self._pages):
                if not shard.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    for entry in os.scandir(shard.path):
                        if not _NAME.fullmatch(entry.name) or entry.name[:2] != shard.name:
                            continue
                        with contextlib.suppress(OSError):
                            st = entry.stat(follow_symlinks=False)
                            found.append((st.st_mtime, entry.name, st.st_size))
        with self._lock:
            for _, name, size in sorted(found):
                self._lru[name] = size
                self._committed += size
            self._reclaim_tmp()

    def _reclaim_tmp(self) -> None:
        """Remove temp files whose writer is gone; count those of live writers (lock held)."""
        self._foreign_tmp.clear()
        try:
            entries = list(os.scandir(self._tmp))
        except OSError:
            return
        reclaimed = 0
        for entry in entries:
            if not entry.name.endswith(_TMP_SUFFIX):
                continue
            path = Path(entry.path)
            if path in self._own_tmp:
                continue
            state = self._tmp_state(path)
            if state is None:
                continue
            if state == -1:
                reclaimed += 1
            else:
                self._foreign_tmp[path] = state
        if reclaimed:
            self._errors["stale_tmp"] += reclaimed
            logger.info(
                "FilePageStore: removed %d temp file(s) of writers that died mid-write", reclaimed
            )

    @staticmethod
    def _tmp_state(path: Path) -> int | None:
        """-1: removed (its writer is gone); n: bytes of a live writer's file; None: gone."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return os.fstat(fd).st_size
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return -1
        except OSError:
            return None
        finally:
            os.close(fd)

    def _recheck_foreign_tmp(self) -> None:
        """Drop counted temp files of other writers that are gone or finished (lock held)."""
        for path in list(self._foreign_tmp):
            state = self._tmp_state(path)
            if state is None or state == -1:
                del self._foreign_tmp[path]
            else:
                self._foreign_tmp[path] = state

    # ------------------------------------------------------------- accounting
    def _on_disk(self) -> int:
        return self._committed + self._reserved + sum(self._foreign_tmp.values())

    def _drop(self, name: str) -> None:
        """Forget a page and delete its file (lock held)."""
        size = self._lru.pop(name, None)
        if size is not None:
            self._committed -= size
        with contextlib.suppress(OSError):
            self._file(name).unlink()

    def _adopt(self, name: str) -> None:
        """Mark a page just read or found whole as most recently used."""
        with self._lock:
            if name in self._lru:
                self._lru.move_to_end(name)
                return
            try:
                size = self._file(name).stat().st_size
            except OSError:
                return  # removed meanwhile (evicted, cleared)
            self._lru[name] = size
            self._committed += size
            if self._capacity is not None and self._on_disk() > self._capacity:
                self._make_room(0, protect=name)

    def _make_room(self, need: int, protect: str) -> bool:
        """Evict LRU pages until ``need`` more bytes fit (lock held); False if impossible."""
        if self._capacity is None:
            return True
        if need > self._capacity:
            return False
        if self._foreign_tmp and self._on_disk() + need > self._capacity:
            self._recheck_foreign_tmp()
        while self._on_disk() + need > self._capacity:
            victim = next((k for k in self._lru if k != protect), None)
            if victim is None:
                return False
            self._drop(victim)
            self._counts["evicted_pages"] += 1
        return True

    # -------------------------------------------------------------- transfers
    def batch_exists(self, keys: Sequence[str]) -> int:
        """Consecutive keys, from the first, whose page file is on disk whole (by size)."""
        key_list = check_keys(keys)
        _, fmt = self._snapshot()
        if fmt is None:
            raise PageStoreNotReadyError("call register_host_pool(host) before batch_exists")
        want = HEADER_SIZE + fmt.page_bytes
        hits = 0
        for key in key_list:
            try:
                if self._file(self._name(fmt, key)).stat().st_size != want:
                    break
            except OSError:
                break
            hits += 1
        return hits

    def batch_set(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Write each page whole (skipping pages already whole on disk); one bool per key."""
        host, fmt = self._snapshot()
        pages = resolve_pages(host, fmt, keys, host_indices)
        assert fmt is not None  # resolve_pages raised otherwise
        return [self._set_page(fmt, page) for page in pages]

    def _set_page(self, fmt: PageFormat, page: Page) -> bool:
        name = self._name(fmt, page.key)
        path = self._file(name)
        size = HEADER_SIZE + page.nbytes
        try:
            whole = path.stat().st_size == size
        except OSError:
            whole = False
        if whole:
            self._adopt(name)
            with self._lock:
                self._counts["pages_skipped"] += 1
                self._counts["pages_set"] += 1
            return True
        with self._lock:
            if not self._make_room(size, protect=name):
                self._counts["pages_set_failed"] += 1
                self._errors["no_space"] += 1
                return False
            self._reserved += size
        committed = False
        try:
            committed = self._write_and_commit(fmt, page, name, size)
        except OSError as exc:
            logger.warning("FilePageStore: writing page %r failed: %s", page.key, exc)
            with self._lock:
                self._errors["io_error"] += 1
        finally:
            if not committed:
                with self._lock:
                    self._reserved -= size
                    self._counts["pages_set_failed"] += 1
        return committed

    def _write_and_commit(self, fmt: PageFormat, page: Page, name: str, size: int) -> bool:
        """Write the page to a locked temp file and rename it into place; True once committed.

        The commit (rename plus index update) runs under the store lock, so
        ``clear()`` and eviction see a page either before or after it.
        """
        path = self._file(name)
        fd, tmp = self._open_tmp(name)
        try:
            views = [_host_view(ptr, n) for ptr, n in zip(page.ptrs, page.sizes, strict=True)]
            crc = 0
            for view in views:
                crc = zlib.crc32(view, crc)
            header = PageHeader.new(fmt.digest, page.key, page.nbytes, crc).pack()
            self._write_all(fd, [memoryview(header), *views])
            if self._fsync:
                os.fsync(fd)
            path.parent.mkdir(exist_ok=True)
            with self._lock:
                os.replace(tmp, path)
                old = self._lru.pop(name, None)
                if old is not None:
                    self._committed -= old
                self._lru[name] = size
                self._committed += size
                self._reserved -= size
                self._counts["pages_set"] += 1
                self._counts["bytes_set"] += page.nbytes
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        finally:
            with self._lock:
                self._own_tmp.discard(tmp)
            os.close(fd)
        if self._fsync:
            self._fsync_dir(path.parent)
        return True

    def _open_tmp(self, name: str) -> tuple[int, Path]:
        """Create and ``flock`` a fresh temp file; retried if a reclaimer took it meanwhile."""
        for _ in range(3):
            tmp = self._tmp / f"{name[:16]}.{os.getpid()}.{uuid.uuid4().hex}{_TMP_SUFFIX}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with self._lock:
                self._own_tmp.add(tmp)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                # Another store may have locked and removed it between open and flock.
                if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                    return fd, tmp
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                with self._lock:
                    self._own_tmp.discard(tmp)
                raise
            os.close(fd)
            with self._lock:
                self._own_tmp.discard(tmp)
        raise OSError("temp files keep vanishing (another store is clearing the directory)")

    @staticmethod
    def _write_all(fd: int, views: list[memoryview]) -> None:
        for whole in views:
            view = whole
            while view.nbytes:
                done = os.write(fd, view)
                view = view[done:]

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        with contextlib.suppress(OSError):
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _staging_buffer(self, size: int) -> ctypes.Array[ctypes.c_char]:
        buf: ctypes.Array[ctypes.c_char] | None = getattr(self._staging, "buf", None)
        if buf is None or len(buf) < size:
            buf = ctypes.create_string_buffer(size)
            self._staging.buf = buf
        return buf

    def _read_page(self, fmt: PageFormat, page: Page, name: str) -> int | None:
        """Read and verify the page file into this thread's staging buffer; its address or None."""
        path = self._file(name)
        want = HEADER_SIZE + page.nbytes
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
        except FileNotFoundError:
            with self._lock:
                self._errors["missing"] += 1
                size = self._lru.pop(name, None)  # removed behind this store's back
                if size is not None:
                    self._committed -= size
            return None
        except OSError as exc:
            logger.warning("FilePageStore: opening %s failed: %s", path, exc)
            with self._lock:
                self._errors["io_error"] += 1
            return None
        buf = self._staging_buffer(want)
        view = memoryview(buf).cast("B")[:want]
        problem = None
        with f:
            try:
                st = os.fstat(f.fileno())
                if st.st_size != want:
                    problem = f"length {st.st_size} != {want}"
                else:
                    got = 0
                    while got < want:
                        n = f.readinto(view[got:])
                        if not n:
                            break
                        got += n
                    if got != want:
                        problem = f"short read: {got} of {want} bytes"
            except OSError as exc:
                logger.warning("FilePageStore: reading %s failed: %s", path, exc)
                with self._lock:
                    self._errors["io_error"] += 1
                return None
            if problem is None:
                header = PageHeader.unpack(view)
                if header is None:
                    problem = "bad magic"
                else:
                    problem = header.problem(fmt.digest, page.key, page.nbytes, need_crc=True)
                    if problem is None and zlib.crc32(view[HEADER_SIZE:]) != header.crc32:
                        problem = "checksum mismatch"
            if problem is not None:
                self._drop_corrupt(page.key, name, st, problem)
                return None
        return ctypes.addressof(buf)

    def _drop_corrupt(self, page_key: str, name: str, read: os.stat_result, problem: str) -> None:
        logger.warning("FilePageStore: page %r is corrupt (%s); dropping it", page_key, problem)
        with self._lock:
            self._errors["corrupt"] += 1
            try:
                now = self._file(name).stat()
            except OSError:
                return
            # Only the file that was read: a writer may have replaced it meanwhile.
            if (now.st_ino, now.st_dev) == (read.st_ino, read.st_dev):
                self._drop(name)

    def batch_get(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Read and verify each page whole, then copy it into the host pool; one bool per key."""
        host, fmt = self._snapshot()
        pages = resolve_pages(host, fmt, keys, host_indices)
        assert fmt is not None  # resolve_pages raised otherwise
        results = []
        for page in pages:
            name = self._name(fmt, page.key)
            base = self._read_page(fmt, page, name)
            if base is None:
                with self._lock:
                    self._counts["pages_get_failed"] += 1
                results.append(False)
                continue
            off = base + HEADER_SIZE
            for ptr, size in zip(page.ptrs, page.sizes, strict=True):
                ctypes.memmove(ptr, off, size)
                off += size
            self._adopt(name)
            with self._lock:
                self._counts["pages_get"] += 1
                self._counts["bytes_get"] += page.nbytes
            results.append(True)
        return results

    # ------------------------------------------------------------ management
    def clear(self) -> None:
        """Delete every stored page of every format (counters are kept).

        Writes in flight finish and count as written after the clear; temp
        files of writers that died are removed.
        """
        with self._lock:
            with contextlib.suppress(OSError):
                for shard in os.scandir(self._pages):
                    if not shard.is_dir(follow_symlinks=False):
                        continue
                    with contextlib.suppress(OSError):
                        for entry in os.scandir(shard.path):
                            if _NAME.fullmatch(entry.name):
                                with contextlib.suppress(OSError):
                                    os.unlink(entry.path)
            self._lru.clear()
            self._committed = 0
            self._reclaim_tmp()

    def stats(self) -> PageStoreStats:
        with self._lock:
            if self._foreign_tmp:
                self._recheck_foreign_tmp()
            c = self._counts
            return PageStoreStats(
                pages_set=c["pages_set"],
                pages_set_failed=c["pages_set_failed"],
                pages_skipped=c["pages_skipped"],
                pages_get=c["pages_get"],
                pages_get_failed=c["pages_get_failed"],
                bytes_set=c["bytes_set"],
                bytes_get=c["bytes_get"],
                evicted_pages=c["evicted_pages"],
                stored_pages=len(self._lru),
                stored_bytes=self._on_disk(),
                errors=dict(self._errors),
            )
