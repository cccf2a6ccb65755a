"""The page index of :class:`~sgl_core.l3.FilePageStore`: LRU order, byte accounting, eviction.

One lock guards the index, the counters, and every rename and unlink of a page file.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import logging
import os
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

from sgl_core.l3._file_disk import PAGE_NAME, TMP_SUFFIX, check_root, hold_root, tmp_state
from sgl_core.l3._format import PageFormat
from sgl_core.l3._pages import StoreState
from sgl_core.l3._protocol import PageStoreArgumentError, PageStoreRootError, PageStoreStats

__all__ = ["FileIndex"]

logger = logging.getLogger(__name__)


class FileIndex(StoreState):
    """The directory, its page index and counters (the file store's base)."""

    def __init__(self, root: str | os.PathLike[str], capacity_bytes: int | None) -> None:
        if capacity_bytes is not None and (
            isinstance(capacity_bytes, bool)
            or not isinstance(capacity_bytes, int)
            or capacity_bytes <= 0
        ):
            raise PageStoreArgumentError(
                f"capacity_bytes must be a positive int or None, got {capacity_bytes!r}"
            )
        self._root = check_root(root)
        self._pages = self._root / "pages"
        self._tmp = self._root / "tmp"
        try:
            self._pages.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
        except (OSError, UnicodeEncodeError) as exc:
            raise PageStoreRootError(
                f"cannot use {str(self._root)!r} as an L3 root: {exc}"
            ) from exc
        # Before anything on disk is read or removed: a refused open changes nothing.
        fd = hold_root(self._root, exclusive=capacity_bytes is not None)
        self._release = weakref.finalize(self, os.close, fd)
        self._capacity = capacity_bytes
        super().__init__()
        # name -> file bytes, least recently used first: pages this store knows are on disk.
        self._lru: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._committed = 0  # sum of self._lru
        self._reserved = 0  # this store's writes in flight (temp files)
        self._foreign_tmp: dict[Path, int] = {}  # temp files of other live writers
        self._own_tmp: set[Path] = set()  # this store's temp files (counted in _reserved)
        found: list[tuple[float, str, int]] = []
        for entry in self._page_entries():
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                found.append((st.st_mtime, entry.name, st.st_size))
        with self._lock:
            for _, name, size in sorted(found):  # oldest first: least recently used
                self._lru[name] = size
                self._committed += size
            self._reclaim_tmp()

    @property
    def root(self) -> Path:
        return self._root

    @property
    def capacity_bytes(self) -> int | None:
        return self._capacity

    def close(self) -> None:
        """Release the root for other stores (also done when the store is collected).

        Pages stay on disk; the store must not be used afterwards.
        """
        self._release()

    def _name(self, fmt: PageFormat, page_key: str) -> str:
        return hashlib.sha256(fmt.digest + b"\x00" + page_key.encode()).hexdigest()

    def _file(self, name: str) -> Path:
        return self._pages / name[:2] / name

    def _page_entries(self) -> Iterator[os.DirEntry[str]]:
        """Every page file in its own shard of the pages directory; unreadable parts skipped."""
        with contextlib.suppress(OSError):
            for shard in os.scandir(self._pages):
                if not shard.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    for entry in os.scandir(shard.path):
                        if PAGE_NAME.fullmatch(entry.name) and entry.name[:2] == shard.name:
                            yield entry

    def _reclaim_tmp(self) -> None:
        """Remove temp files whose writer is gone; count those of live writers (lock held)."""
        self._foreign_tmp.clear()
        try:
            entries = list(os.scandir(self._tmp))
        except OSError:
            return
        reclaimed = 0
        for entry in entries:
            if not entry.name.endswith(TMP_SUFFIX):
                continue
            path = Path(entry.path)
            state = None if path in self._own_tmp else tmp_state(path)
            if state == -1:
                reclaimed += 1
            elif state is not None:
                self._foreign_tmp[path] = state
        if reclaimed:
            self._errors["stale_tmp"] += reclaimed
            logger.info(
                "FilePageStore: removed %d temp file(s) of writers that died mid-write", reclaimed
            )

    def _on_disk(self) -> int:
        return self._committed + self._reserved + sum(self._foreign_tmp.values())

    def _forget(self, name: str) -> None:
        """Drop a page from the index, not its file (lock held)."""
        self._committed -= self._lru.pop(name, 0)

    def _drop(self, name: str) -> None:
        """Forget a page and delete its file (lock held)."""
        self._forget(name)
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
            self._make_room(0, protect=name)  # evicts only when now over capacity

    def _make_room(self, need: int, protect: str) -> bool:
        """Evict LRU pages until ``need`` more bytes fit (lock held); False if impossible."""
        if self._capacity is None:
            return True
        if need > self._capacity:
            return False
        if self._foreign_tmp and self._on_disk() + need > self._capacity:
            self._reclaim_tmp()  # other writers may have finished or died
        while self._on_disk() + need > self._capacity:
            victim = next((k for k in self._lru if k != protect), None)
            if victim is None:
                return False
            self._drop(victim)
            self._counts["evicted_pages"] += 1
        return True

    def _open_tmp(self, name: str) -> tuple[int, Path]:
        """Create and ``flock`` a fresh temp file; retried if a reclaimer took it meanwhile."""
        for _ in range(3):
            tmp = self._tmp / f"{name[:16]}.{os.getpid()}.{uuid.uuid4().hex}{TMP_SUFFIX}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with self._lock:
                self._own_tmp.add(tmp)
            ours = False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                # Another store may have locked and removed it between open and flock.
                with contextlib.suppress(FileNotFoundError):
                    ours = os.stat(tmp).st_ino == os.fstat(fd).st_ino
            finally:
                if not ours:
                    os.close(fd)
                    with self._lock:
                        self._own_tmp.discard(tmp)
            if ours:
                return fd, tmp
        raise OSError("temp files keep vanishing (another store is clearing the directory)")

    def clear(self) -> None:
        """Delete every stored page of every format (counters are kept).

        Writes in flight finish and count as written after the clear; temp
        files of writers that died are removed.
        """
        with self._lock:
            for entry in self._page_entries():
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            self._lru.clear()
            self._committed = 0
            self._reclaim_tmp()

    def stats(self) -> PageStoreStats:
        with self._lock:
            if self._foreign_tmp:
                self._reclaim_tmp()
            return PageStoreStats.from_counts(
                self._counts,
                self._errors,
                stored_pages=len(self._lru),
                stored_bytes=self._on_disk(),
            )

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
