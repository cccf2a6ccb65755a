"""The L3 page record and the file store's read path, field by field (issue #24).

Every field of the 72-byte header, every length check of a read and every
way a read can fail is exercised through ``FilePageStore``'s public calls: a
rejected page is a miss (``False``), the host page it would have filled is
byte-identical afterwards, the right error is counted and the byte
accounting drops exactly that file. ``hold_root``'s flags (create, no
symlinks, close-on-exec, non-blocking) and its error paths are checked too.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _l3_helpers import PAGE, raw_page, round_keys, tokens, torch_host

from sgl_core.l3 import (
    FilePageStore,
    PageStoreRootError,
    PageStoreRootInUseError,
    _file_disk,
    _file_store,
)
from sgl_core.l3._record import FLAG_CRC, HEADER_SIZE, MAGIC, PageHeader, key_digest

LAYOUT = "<8s16s16s16sQII"
FMT = bytes(range(16))
OTHER_FMT = bytes(range(1, 17))


# ------------------------------------------------------------- the record
def test_key_digest_is_sha256_of_the_utf8_key() -> None:
    for key in ("k", "päge/ключ", ""):
        assert key_digest(key) == hashlib.sha256(key.encode("utf-8")).digest()[:16]
    assert len(key_digest("k")) == 16


def test_header_packs_every_field_in_the_documented_layout() -> None:
    h = PageHeader.new(FMT, "page-key", 123_456_789_012, crc32=0xDEADBEEF)
    assert h.format_digest == FMT
    assert h.key_digest == hashlib.sha256(b"page-key").digest()[:16]
    assert len(h.write_id) == 16
    assert (h.payload_bytes, h.crc32, h.flags) == (123_456_789_012, 0xDEADBEEF, FLAG_CRC)
    want = struct.pack(
        LAYOUT, b"SGLL3PG2", FMT, h.key_digest, h.write_id, 123_456_789_012, 0xDEADBEEF, 1
    )
    assert MAGIC == b"SGLL3PG2"
    assert HEADER_SIZE == 72 == len(want)
    assert h.pack() == want
    buf = bytearray(b"\xaa" * (HEADER_SIZE + 9))
    h.pack_into(buf, 9)
    assert buf[:9] == b"\xaa" * 9 and bytes(buf[9:]) == want
    at_start = bytearray(HEADER_SIZE + 3)
    h.pack_into(memoryview(at_start))
    assert bytes(at_start[:HEADER_SIZE]) == want and at_start[HEADER_SIZE:] == b"\0\0\0"
    assert PageHeader.unpack(want) == h


def test_new_sets_the_checksum_flag_exactly_when_a_crc_is_given() -> None:
    plain = PageHeader.new(FMT, "k", 10)
    assert (plain.crc32, plain.flags) == (0, 0)
    zero = PageHeader.new(FMT, "k", 10, crc32=0)  # a real checksum of value 0
    assert (zero.crc32, zero.flags) == (0, FLAG_CRC)
    assert PageHeader.new(FMT, "k", 10).write_id != plain.write_id  # unique per write
    assert PageHeader.unpack(plain.pack()) == plain


def test_unpack_edges() -> None:
    h = PageHeader.new(FMT, "k", 7, crc32=5)
    packed = h.pack()
    assert PageHeader.unpack(packed[:-1]) is None  # one byte short
    assert PageHeader.unpack(b"") is None
    assert PageHeader.unpack(packed) == h  # exactly a header
    assert PageHeader.unpack(bytearray(packed + b"payload")) == h
    assert PageHeader.unpack(memoryview(packed + b"x")) == h
    for i in (0, 7):
        bad = bytearray(packed)
        bad[i] ^= 0x01
        assert PageHeader.unpack(bad) is None


def test_problem_names_each_field_that_differs() -> None:
    h = PageHeader.new(FMT, "k", 100, crc32=9)
    assert h.problem(FMT, "k", 100, need_crc=True) is None
    assert h.problem(FMT, "k", 100, need_crc=False) is None
    assert (
        h.problem(OTHER_FMT, "k", 100, need_crc=True) == "written by a pool of another page format"
    )
    assert h.problem(OTHER_FMT, "other", 99, need_crc=True) == (
        "written by a pool of another page format"
    )
    assert h.problem(FMT, "other", 100, need_crc=True) == "holds another page key"
    assert h.problem(FMT, "other", 99, need_crc=True) == "holds another page key"
    assert h.problem(FMT, "k", 101, need_crc=True) == "payload of 100 bytes, expected 101"
    assert h.problem(FMT, "k", 99, need_crc=True) == "payload of 100 bytes, expected 99"
    plain = PageHeader.new(FMT, "k", 100)
    assert plain.problem(FMT, "k", 100, need_crc=True) == "no checksum"
    assert plain.problem(FMT, "k", 100, need_crc=False) is None
    other_flag = PageHeader(FMT, key_digest("k"), b"w" * 16, 100, 0, 2)
    assert other_flag.problem(FMT, "k", 100, need_crc=True) == "no checksum"
    both = PageHeader(FMT, key_digest("k"), b"w" * 16, 100, 0, 3)
    assert both.problem(FMT, "k", 100, need_crc=True) is None


# ------------------------------------------------------ the store's read path
class Stored:
    """Two pages written from host pages 2..3 of a seeded pool; targets are pages 5..6."""

    def __init__(self, root: Path, layout: str = "page_first", seed: int = 31) -> None:
        self.host = torch_host(layout, seed=seed)
        self.store = FilePageStore(root)
        self.store.register_host_pool(self.host)
        self.keys = round_keys("r/", 0, pages=2)
        assert self.store.batch_set(self.keys, tokens(2, 2)) == [True, True]
        self.want = [raw_page(self.host, p * PAGE) for p in (2, 3)]
        self.file_bytes = self.store.stats().stored_bytes // 2
        assert self.file_bytes == HEADER_SIZE + len(self.want[0])

    def path(self, i: int) -> Path:
        return self.store._path(self.keys[i])

    def targets(self) -> list[bytes]:
        return [raw_page(self.host, p * PAGE) for p in (5, 6)]

    def get(self) -> list[bool]:
        return self.store.batch_get(self.keys, tokens(5, 2))


def _errors(store: FilePageStore) -> tuple[int, int, int]:
    """(corrupt, missing, io_error) as counted by the store."""
    e = store.stats().errors
    return e.get("corrupt", 0), e.get("missing", 0), e.get("io_error", 0)


@pytest.fixture
def stored(tmp_path: Path) -> Stored:
    return Stored(tmp_path / "l3")


def test_a_good_read_copies_exact_bytes(stored: Stored) -> None:
    assert stored.targets() != stored.want
    assert stored.get() == [True, True]
    assert stored.targets() == stored.want
    assert _errors(stored.store) == (0, 0, 0)
    assert stored.store.stats().stored_bytes == 2 * stored.file_bytes


def _flip(offset: int) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        out = bytearray(data)
        out[offset] ^= 0x10
        return bytes(out)

    return edit


_FLAGS_AT = HEADER_SIZE - 4
CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "one byte short": lambda d: d[:-1],
    "one byte long": lambda d: d + b"\0",
    "header only": lambda d: d[:HEADER_SIZE],
    "empty": lambda d: b"",
    "magic first byte": _flip(0),
    "magic last byte": _flip(7),
    "format digest": _flip(8),
    "format digest last byte": _flip(23),
    "key digest": _flip(24),
    "key digest last byte": _flip(39),
    "payload length": _flip(56),
    "payload length high byte": _flip(63),
    "crc field": _flip(64),
    "no checksum flag": lambda d: d[:_FLAGS_AT] + struct.pack("<I", 0) + d[HEADER_SIZE:],
    "payload first byte": _flip(HEADER_SIZE),
    "payload last byte": _flip(-1),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupt_page_file_is_a_counted_miss_and_dropped(stored: Stored, case: str) -> None:
    path = stored.path(0)
    # A good read first: this thread's staging buffer then holds the page's valid
    # record, so a check that is skipped would hand back the stale bytes as a hit.
    assert stored.store.batch_get(stored.keys[:1], tokens(7, 1)) == [True]
    path.write_bytes(CORRUPTIONS[case](path.read_bytes()))
    before = stored.targets()
    assert stored.get() == [False, True]
    after = stored.targets()
    assert after[0] == before[0]  # the rejected page left its host page alone
    assert after[1] == stored.want[1]
    assert _errors(stored.store) == (1, 0, 0)
    assert not path.exists()  # dropped, and no longer counted
    assert stored.store.stats().stored_bytes == stored.file_bytes
    assert stored.store.batch_exists(stored.keys) == 0


def test_another_keys_file_under_this_key_is_a_miss(stored: Stored) -> None:
    stored.path(0).write_bytes(stored.path(1).read_bytes())  # whole, checksummed, other key
    before = stored.targets()
    assert stored.get() == [False, True]
    assert stored.targets()[0] == before[0]
    assert _errors(stored.store) == (1, 0, 0)


def test_a_page_file_removed_behind_the_store_is_a_missing_page(stored: Stored) -> None:
    third = round_keys("x/", 0, pages=1)
    assert stored.store.batch_set(third, tokens(7, 1)) == [True]  # three files stored
    stored.path(0).unlink()
    before = stored.targets()
    assert stored.get() == [False, True]
    assert stored.targets()[0] == before[0]
    assert _errors(stored.store) == (0, 1, 0)
    assert stored.store.stats().stored_bytes == 2 * stored.file_bytes  # forgotten exactly once
    assert stored.store.batch_get(stored.keys[:1], tokens(5, 1)) == [False]
    assert _errors(stored.store) == (0, 2, 0)
    assert stored.store.stats().stored_bytes == 2 * stored.file_bytes
    assert stored.targets()[0] == before[0]


def test_a_page_file_that_cannot_be_opened_is_an_io_error(stored: Stored) -> None:
    path = stored.path(0)
    path.unlink()
    path.mkdir()  # opening it raises IsADirectoryError, an OSError but not FileNotFoundError
    before = stored.targets()
    assert stored.get() == [False, True]
    assert stored.targets()[0] == before[0]
    assert _errors(stored.store) == (0, 0, 1)
    assert path.is_dir()
    stored.path(1).unlink()
    stored.path(1).mkdir()
    assert stored.get() == [False, False]  # counted once per failed open
    assert _errors(stored.store) == (0, 0, 3)
    assert stored.targets() == [before[0], stored.want[1]]


class _ChunkedFile:
    """A page file whose reads return at most ``chunk`` bytes; ``limit`` total, then EOF."""

    def __init__(self, f: Any, chunk: int, limit: int | None, fail: bool) -> None:
        self._f, self._chunk, self._left, self._fail = f, chunk, limit, fail

    def fileno(self) -> int:
        return int(self._f.fileno())

    def readinto(self, view: memoryview) -> int:
        if self._fail:
            raise OSError(errno.EIO, "injected read error")
        n = min(len(view), self._chunk)
        if self._left is not None:
            n = min(n, self._left)
            self._left -= n
        return int(self._f.readinto(view[:n])) if n else 0

    def __enter__(self) -> _ChunkedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def _patch_open(
    monkeypatch: pytest.MonkeyPatch, chunk: int, limit: int | None = None, fail: bool = False
) -> None:
    def fake_open(path: Any, mode: str = "r", buffering: int = -1) -> _ChunkedFile:
        return _ChunkedFile(open(path, mode, buffering=buffering), chunk, limit, fail)

    monkeypatch.setattr(_file_store, "open", fake_open, raising=False)


@pytest.mark.parametrize("chunk", [1000, 4096, 7])
def test_partial_reads_are_assembled_into_the_whole_page(
    stored: Stored, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    _patch_open(monkeypatch, chunk)
    assert stored.get() == [True, True]
    assert stored.targets() == stored.want
    assert _errors(stored.store) == (0, 0, 0)


@pytest.mark.parametrize("short_by", [1, 1000])
def test_a_short_read_is_a_corrupt_miss(
    stored: Stored, monkeypatch: pytest.MonkeyPatch, short_by: int
) -> None:
    # primed with the page's valid record: a short read must not be topped up from it
    assert stored.store.batch_get(stored.keys[:1], tokens(7, 1)) == [True]
    _patch_open(monkeypatch, 1000, limit=stored.file_bytes - short_by)
    before = stored.targets()
    assert stored.store.batch_get(stored.keys[:1], tokens(5, 1)) == [False]
    assert stored.targets()[0] == before[0]
    assert _errors(stored.store) == (1, 0, 0)


def test_a_read_error_is_an_io_error_and_keeps_the_file(
    stored: Stored, monkeypatch: pytest.MonkeyPatch
) -> None:
    _patch_open(monkeypatch, 1000, fail=True)
    before = stored.targets()
    assert stored.get() == [False, False]
    assert stored.targets() == before
    assert _errors(stored.store) == (0, 0, 2)
    monkeypatch.undo()
    assert stored.store.batch_exists(stored.keys) == 2  # a read error is no reason to drop
    assert stored.get() == [True, True]
    assert stored.targets() == stored.want


def test_reads_of_a_smaller_format_after_a_larger_one_use_only_their_bytes(
    tmp_path: Path,
) -> None:
    """The staging buffer is kept per thread and only grows: a read must use ``want`` bytes."""
    root = tmp_path / "l3"
    big = torch_host("page_first", seed=41)
    small = torch_host("page_first", kv_lora=32, seed=42)
    store = FilePageStore(root)
    keys = round_keys("s/", 0, pages=1)
    for host in (big, small):
        store.register_host_pool(host)
        assert store.batch_set(keys, tokens(2, 1)) == [True]
    store.register_host_pool(big)
    assert store.batch_get(keys, tokens(5, 1)) == [True]
    assert raw_page(big, 5 * PAGE) == raw_page(big, 2 * PAGE)
    store.register_host_pool(small)
    assert store.batch_get(keys, tokens(5, 1)) == [True]
    assert raw_page(small, 5 * PAGE) == raw_page(small, 2 * PAGE)
    assert _errors(store) == (0, 0, 0)


# ------------------------------------------------------------- hold_root
def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return out


def _lock_fds(root: Path) -> list[int]:
    lock = str((root / "store.lock").resolve())
    return [fd for fd, target in _fds().items() if target == lock]


def test_the_root_lock_is_created_private_and_close_on_exec(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    old = os.umask(0o022)
    try:
        store = FilePageStore(root, capacity_bytes=10**6)
    finally:
        os.umask(old)
    lock = root / "store.lock"
    st = os.lstat(lock)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    (fd,) = _lock_fds(root)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert os.get_blocking(fd)  # a plain fd; the lock itself is what is held
    with pytest.raises(PageStoreRootInUseError):
        FilePageStore(root)  # held exclusively: even an unbounded store is refused
    store.close()
    assert _lock_fds(root) == []


def test_shared_and_exclusive_holds_in_one_process(tmp_path: Path) -> None:
    root = tmp_path / "l3"
    a, b = FilePageStore(root), FilePageStore(root)  # unbounded stores share
    with pytest.raises(PageStoreRootInUseError, match="is held by another live store: "):
        FilePageStore(root, capacity_bytes=10**6)
    a.close()
    with pytest.raises(PageStoreRootInUseError):
        FilePageStore(root, capacity_bytes=10**6)
    b.close()
    c = FilePageStore(root, capacity_bytes=10**6)
    with pytest.raises(PageStoreRootInUseError, match="is held by a live bounded store: "):
        FilePageStore(root)
    c.close()


def test_a_refused_open_leaves_no_descriptor_behind(tmp_path: Path) -> None:
    root = tmp_path / "l3"
    held = FilePageStore(root, capacity_bytes=10**6)
    before = set(_fds())
    for capacity in (10**6, None):
        with pytest.raises(PageStoreRootInUseError):
            FilePageStore(root, capacity)
    assert set(_fds()) == before
    held.close()


def test_a_symlinked_lock_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "l3"
    FilePageStore(root).close()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    (root / "store.lock").unlink()
    (root / "store.lock").symlink_to(target)
    before = set(_fds())
    with pytest.raises(PageStoreRootError, match="cannot use"):
        FilePageStore(root, capacity_bytes=10**6)
    assert target.read_bytes() == b"keep"
    assert set(_fds()) == before


def test_a_lock_path_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "l3"
    (root / "store.lock").mkdir(parents=True)
    with pytest.raises(PageStoreRootError, match="cannot use"):
        FilePageStore(root)
    assert (root / "store.lock").is_dir()


def test_a_failing_lock_call_is_a_root_error_and_closes_its_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "l3"
    FilePageStore(root).close()
    calls: list[int] = []

    def failing_flock(fd: int, op: int) -> None:
        calls.append(op)
        raise OSError(errno.ENOLCK, "injected")

    monkeypatch.setattr(_file_disk.fcntl, "flock", failing_flock)
    before = set(_fds())
    for capacity in (10**6, None):
        with pytest.raises(PageStoreRootError, match="cannot lock") as info:
            FilePageStore(root, capacity)
        assert not isinstance(info.value, PageStoreRootInUseError)
    assert calls == [fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_SH | fcntl.LOCK_NB]
    assert set(_fds()) == before
