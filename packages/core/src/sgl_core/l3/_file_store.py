"""``FilePageStore``: the embedded L3 default, a directory of one file per page object.

On-disk format (little-endian), one file per object under
``<root>/objects/<xx>/<sha256(object key)>``::

    b"SGLL3OB1"  u32 crc32(payload)  u32 len(key)  u64 len(payload)  key  payload

* Writes are atomic: the file is written under ``<root>/tmp/`` and renamed
  into place (``os.replace``), so a reader sees a whole object or none.
* Reads verify magic, key, length and CRC-32 of every object of a page into
  a staging buffer first and copy into the host pool only when all of them
  check out. A bad object is a miss: it is logged, counted as ``"corrupt"``
  and deleted, and the page can be stored again. (CRC-32 catches storage and
  truncation faults; it is not a defence against a malicious writer.)
* ``capacity_bytes`` bounds the bytes on disk (headers included); when a new
  page does not fit, whole pages are evicted least-recently-used first (a
  set or a get counts as a use). Pages found on disk when the store opens, or
  written by another process sharing the directory, join the LRU order when
  first seen, oldest modification time first.
* One lock guards the index and the counters; file I/O runs outside it, so
  threads (and processes sharing the directory) can read and write at once.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import hashlib
import logging
import os
import shutil
import struct
import threading
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path

import torch

from sgl_core._protocols import MLAHostPool
from sgl_core.l3._errors import PageStoreArgumentError, PageStoreNotReadyError
from sgl_core.l3._pages import PageObjects, check_keys, object_key, objects_per_page, resolve_pages
from sgl_core.l3._protocol import PageStoreStats

__all__ = ["FilePageStore"]

logger = logging.getLogger(__name__)

_MAGIC = b"SGLL3OB1"
_HEADER = struct.Struct("<8sIIQ")


@dataclasses.dataclass
class _Entry:
    """Files of one page key on disk and their total size."""

    files: set[Path]
    nbytes: int


def _host_view(ptr: int, size: int) -> memoryview:
    return memoryview((ctypes.c_char * size).from_address(ptr)).cast("B")


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
        self._root = Path(root)
        self._objects = self._root / "objects"
        self._tmp = self._root / "tmp"
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._capacity = capacity_bytes
        self._fsync = fsync
        self._lock = threading.RLock()
        self._lru: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._used = 0
        self._host: MLAHostPool | None = None
        self._n_objects = 0
        self._counts: collections.Counter[str] = collections.Counter()
        self._errors: collections.Counter[str] = collections.Counter()
        self._scan()

    # ------------------------------------------------------------------ setup
    @property
    def root(self) -> Path:
        return self._root

    @property
    def capacity_bytes(self) -> int | None:
        return self._capacity

    def register_host_pool(self, host: MLAHostPool) -> None:
        """Bind ``host``; its page layout fixes the number of objects per page."""
        n = objects_per_page(host)
        with self._lock:
            self._host = host
            self._n_objects = n

    def _path(self, obj_key: str) -> Path:
        digest = hashlib.sha256(obj_key.encode()).hexdigest()
        return self._objects / digest[:2] / digest

    def _scan(self) -> None:
        found: dict[str, tuple[float, _Entry]] = {}
        for path in self._objects.glob("*/*"):
            try:
                with open(path, "rb") as f:
                    head = f.read(_HEADER.size)
                    magic, _crc, klen, _plen = _HEADER.unpack(head)
                    key = f.read(klen).decode()
                st = path.stat()
            except (OSError, struct.error, UnicodeDecodeError):
                continue
            if magic != _MAGIC:
                continue
            page_key = key.rsplit("#", 1)[0]
            mtime, entry = found.setdefault(page_key, (st.st_mtime, _Entry(set(), 0)))
            entry.files.add(path)
            entry.nbytes += st.st_size
            found[page_key] = (max(mtime, st.st_mtime), entry)
        for page_key, (_, entry) in sorted(found.items(), key=lambda kv: kv[1][0]):
            self._lru[page_key] = entry
            self._used += entry.nbytes

    # ------------------------------------------------------------- accounting
    def _adopt(self, page: PageObjects, paths: Sequence[Path]) -> None:
        """Put a page found whole on disk at the MRU end of the index."""
        with self._lock:
            entry = self._lru.get(page.key)
            if entry is None:
                entry = _Entry(set(), 0)
                self._lru[page.key] = entry
            for path in paths:
                if path not in entry.files:
                    try:
                        size = path.stat().st_size
                    except OSError:
                        continue
                    entry.files.add(path)
                    entry.nbytes += size
                    self._used += size
            self._lru.move_to_end(page.key)

    def _forget_file(self, page_key: str, path: Path) -> None:
        with self._lock:
            entry = self._lru.get(page_key)
            if entry is not None and path in entry.files:
                entry.files.discard(path)
                try:
                    size = path.stat().st_size
                except OSError:
                    size = 0
                entry.nbytes -= size
                self._used -= size
            with contextlib.suppress(OSError):
                path.unlink()

    def _evict_for(self, need: int, protect: str) -> bool:
        """Make ``need`` bytes of room (caller holds the lock); False if impossible."""
        if self._capacity is None:
            return True
        if need > self._capacity:
            return False
        while self._used + need > self._capacity:
            victim = next((k for k in self._lru if k != protect), None)
            if victim is None:
                return False
            entry = self._lru.pop(victim)
            for path in entry.files:
                with contextlib.suppress(OSError):
                    path.unlink()
            self._used -= entry.nbytes
            self._counts["evicted_pages"] += 1
        return True

    # -------------------------------------------------------------- transfers
    def _whole_on_disk(self, page: PageObjects) -> bool:
        return all(self._path(k).is_file() for k in page.object_keys)

    def batch_exists(self, keys: Sequence[str]) -> int:
        """Consecutive keys, from the first, whose every object file is on disk."""
        key_list = check_keys(keys)
        with self._lock:
            if self._host is None:
                raise PageStoreNotReadyError("call register_host_pool(host) before batch_exists")
            n = self._n_objects
        hits = 0
        for key in key_list:
            if not all(self._path(object_key(key, j, n)).is_file() for j in range(n)):
                break
            hits += 1
        return hits

    def _write_object(self, obj_key: str, ptr: int, size: int) -> int:
        path = self._path(obj_key)
        path.parent.mkdir(exist_ok=True)
        payload = _host_view(ptr, size)
        kbytes = obj_key.encode()
        header = _HEADER.pack(_MAGIC, zlib.crc32(payload), len(kbytes), size)
        tmp = self._tmp / f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(kbytes)
                f.write(payload)
                if self._fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return len(header) + len(kbytes) + size

    def batch_set(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Write each page's objects (skipping pages already whole on disk)."""
        with self._lock:
            host, n = self._host, self._n_objects
        pages = resolve_pages(host, n, keys, host_indices)
        results = []
        for page in pages:
            results.append(self._set_page(page))
        return results

    def _set_page(self, page: PageObjects) -> bool:
        paths = [self._path(k) for k in page.object_keys]
        if all(p.is_file() for p in paths):
            self._adopt(page, paths)
            with self._lock:
                self._counts["pages_skipped"] += 1
                self._counts["pages_set"] += 1
            return True
        estimate = sum(
            _HEADER.size + len(k.encode()) + s
            for k, s in zip(page.object_keys, page.sizes, strict=True)
        )
        with self._lock:
            entry = self._lru.get(page.key)
            have = entry.nbytes if entry is not None else 0
            if not self._evict_for(max(estimate - have, 0), protect=page.key):
                self._counts["pages_set_failed"] += 1
                self._errors["no_space"] += 1
                return False
            # Reserve the room while writing outside the lock.
            self._used += estimate
        written: list[Path] = []
        try:
            for k, path, ptr, size in zip(
                page.object_keys, paths, page.ptrs, page.sizes, strict=True
            ):
                self._write_object(k, ptr, size)
                written.append(path)
        except OSError as exc:
            logger.warning("FilePageStore: writing page %s failed: %s", page.key, exc)
            with self._lock:
                self._used -= estimate
                self._counts["pages_set_failed"] += 1
                self._errors["io_error"] += 1
            for path in written:
                path.unlink(missing_ok=True)
            return False
        with self._lock:
            self._used -= estimate
            self._adopt(page, paths)
            self._counts["pages_set"] += 1
            self._counts["bytes_set"] += page.nbytes
        return True

    def _read_object(self, page_key: str, obj_key: str, size: int) -> bytearray | None:
        path = self._path(obj_key)
        kbytes = obj_key.encode()
        want = _HEADER.size + len(kbytes) + size
        buf = bytearray(want)
        try:
            with open(path, "rb") as f:
                got = f.readinto(buf)
                extra = f.read(1)
        except FileNotFoundError:
            with self._lock:
                self._errors["missing"] += 1
            return None
        except OSError as exc:
            logger.warning("FilePageStore: reading %s failed: %s", path, exc)
            with self._lock:
                self._errors["io_error"] += 1
            return None
        view = memoryview(buf)
        problem = None
        if got != want or extra:
            problem = f"length {got + len(extra)} != {want}"
        else:
            magic, crc, klen, plen = _HEADER.unpack_from(buf)
            if magic != _MAGIC or klen != len(kbytes) or plen != size:
                problem = "bad header"
            elif bytes(view[_HEADER.size : _HEADER.size + klen]) != kbytes:
                problem = "key mismatch"
            elif zlib.crc32(view[_HEADER.size + klen :]) != crc:
                problem = "checksum mismatch"
        if problem is not None:
            logger.warning(
                "FilePageStore: object %r of page %r is corrupt (%s); dropping it",
                obj_key,
                page_key,
                problem,
            )
            with self._lock:
                self._errors["corrupt"] += 1
            self._forget_file(page_key, path)
            return None
        return buf

    def batch_get(
        self, keys: Sequence[str], host_indices: torch.Tensor | Sequence[int]
    ) -> list[bool]:
        """Read and verify every object of a page, then copy the page into the host pool."""
        with self._lock:
            host, n = self._host, self._n_objects
        pages = resolve_pages(host, n, keys, host_indices)
        results = []
        for page in pages:
            staged: list[bytearray] = []
            for k, size in zip(page.object_keys, page.sizes, strict=True):
                buf = self._read_object(page.key, k, size)
                if buf is None:
                    break
                staged.append(buf)
            if len(staged) != len(page.object_keys):
                with self._lock:
                    self._counts["pages_get_failed"] += 1
                results.append(False)
                continue
            for buf, ptr, size in zip(staged, page.ptrs, page.sizes, strict=True):
                off = len(buf) - size
                _host_view(ptr, size)[:] = memoryview(buf)[off:]
            self._adopt(page, [self._path(k) for k in page.object_keys])
            with self._lock:
                self._counts["pages_get"] += 1
                self._counts["bytes_get"] += page.nbytes
            results.append(True)
        return results

    # ------------------------------------------------------------ management
    def clear(self) -> None:
        """Delete every stored object (counters are kept)."""
        with self._lock:
            shutil.rmtree(self._objects, ignore_errors=True)
            self._objects.mkdir(parents=True, exist_ok=True)
            self._lru.clear()
            self._used = 0

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
                evicted_pages=c["evicted_pages"],
                stored_pages=len(self._lru),
                stored_bytes=self._used,
                errors=dict(self._errors),
            )
