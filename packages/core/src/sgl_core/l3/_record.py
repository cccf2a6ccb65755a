"""The page record: a fixed 72-byte header stored in front of every page's bytes.

Both stores keep a page as one unit (a file, a Mooncake object): this header,
then the page's memory objects (docs/design.md section 8). Little-endian::

    8s   magic            b"SGLL3PG2"
    16s  format digest    PageFormat.digest of the pool that wrote it
    16s  key digest       sha256(page key, utf-8)[:16]
    16s  write id         random, unique per write (which write a reader got)
    u64  payload bytes    the page's bytes after the header
    u32  payload crc32    zlib.crc32 of the payload (0 without FLAG_CRC)
    u32  flags            FLAG_CRC: the crc32 field is set

A reader accepts a unit only if magic, format digest, key digest and payload
length are the ones it expects (and the checksum, where the store keeps one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import uuid
from collections.abc import Callable

__all__ = ["FLAG_CRC", "HEADER_SIZE", "MAGIC", "PageHeader", "key_digest"]

MAGIC = b"SGLL3PG2"
FLAG_CRC = 1
_STRUCT = struct.Struct("<8s16s16s16sQII")
HEADER_SIZE = _STRUCT.size


def key_digest(key: str) -> bytes:
    """16 bytes of SHA-256 of the page key (utf-8)."""
    return hashlib.sha256(key.encode()).digest()[:16]


@dataclasses.dataclass(frozen=True)
class PageHeader:
    """One page record; :meth:`new` for a write, :meth:`unpack` to read one back."""

    format_digest: bytes
    key_digest: bytes
    write_id: bytes
    payload_bytes: int
    crc32: int = 0
    flags: int = 0

    @classmethod
    def new(
        cls, format_digest: bytes, key: str, payload_bytes: int, crc32: int | None = None
    ) -> PageHeader:
        return cls(
            format_digest=format_digest,
            key_digest=key_digest(key),
            write_id=uuid.uuid4().bytes,
            payload_bytes=payload_bytes,
            crc32=0 if crc32 is None else crc32,
            flags=0 if crc32 is None else FLAG_CRC,
        )

    def pack(self) -> bytes:
        return _STRUCT.pack(MAGIC, *dataclasses.astuple(self))

    def pack_into(self, buffer: memoryview | bytearray, offset: int = 0) -> None:
        _STRUCT.pack_into(buffer, offset, MAGIC, *dataclasses.astuple(self))

    @classmethod
    def unpack(cls, buffer: bytes | bytearray | memoryview) -> PageHeader | None:
        """The header at the start of ``buffer``; ``None`` when it is short or lacks the magic."""
        if len(buffer) < HEADER_SIZE:
            return None
        magic, fmt, kd, wid, plen, crc, flags = _STRUCT.unpack_from(buffer)
        if magic != MAGIC:
            return None
        return cls(fmt, kd, wid, plen, crc, flags)

    def problem(
        self, format_digest: bytes, key: str, payload_bytes: int, *, need_crc: bool
    ) -> str | None:
        """Why this header does not describe page ``key`` of that format (``None``: it does)."""
        if self.format_digest != format_digest:
            return "written by a pool of another page format"
        if self.key_digest != key_digest(key):
            return "holds another page key"
        if self.payload_bytes != payload_bytes:
            return f"payload of {self.payload_bytes} bytes, expected {payload_bytes}"
        if need_crc and not self.flags & FLAG_CRC:
            return "no checksum"
        return None

    @classmethod
    def check(
        cls,
        buffer: bytes | bytearray | memoryview,
        format_digest: bytes,
        key: str,
        payload_bytes: int,
        crc32: Callable[[], int] | None,
    ) -> str | None:
        """Why the unit at ``buffer`` is not page ``key`` (``crc32``: the payload's, if kept)."""
        header = cls.unpack(buffer)
        if header is None:
            return "bad magic"
        problem = header.problem(format_digest, key, payload_bytes, need_crc=crc32 is not None)
        if problem is None and crc32 is not None and crc32() != header.crc32:
            return "checksum mismatch"
        return problem
