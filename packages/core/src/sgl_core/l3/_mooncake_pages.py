"""Mooncake page records: header packing, the checks of a fetched page, host-byte saves.

A page object is a :class:`~sgl_core.l3._record.PageHeader` (with the
payload's CRC-32 when checksums are on) followed by the page's memory
objects; headers live in a registered scratch so a put or get moves them in
the same multi-buffer call as the payload.
"""

from __future__ import annotations

import ctypes
import threading

from sgl_core.l3._format import PageFormat
from sgl_core.l3._pages import Page
from sgl_core.l3._record import HEADER_SIZE, PageHeader

__all__ = ["fetched_problem", "pack_headers", "restore_page", "save_pages"]


def pack_headers(scratch: int, fmt: PageFormat, pages: list[Page], verify: bool) -> None:
    """Write one header per page, back to back, at the scratch address ``scratch``."""
    headers = memoryview((ctypes.c_char * (len(pages) * HEADER_SIZE)).from_address(scratch))
    for t, page in enumerate(pages):
        crc = page.crc32() if verify else None
        header = PageHeader.new(fmt.digest, page.key, page.nbytes, crc)
        header.pack_into(headers.cast("B"), t * HEADER_SIZE)


def fetched_problem(raw: memoryview, fmt: PageFormat, page: Page, verify: bool) -> str | None:
    """Why a whole-length fetched page (header bytes ``raw``) is not ``page``, or None."""
    crc = page.crc32 if verify else None
    return PageHeader.check(raw, fmt.digest, page.key, page.nbytes, crc)


def save_pages(tls: threading.local, pages: list[Page]) -> dict[int, int]:
    """Save the pages' host bytes in this thread's scratch; ``{ptr: scratch address}``."""
    need = sum(p.nbytes for p in pages)
    scratch: ctypes.Array[ctypes.c_char] | None = getattr(tls, "buf", None)
    if scratch is None or len(scratch) < need:
        scratch = ctypes.create_string_buffer(need)
        tls.buf = scratch
    base = ctypes.addressof(scratch)
    where: dict[int, int] = {}
    off = 0
    for page in pages:
        for ptr, size in zip(page.ptrs, page.sizes, strict=True):
            ctypes.memmove(base + off, ptr, size)
            where[ptr] = base + off
            off += size
    return where


def restore_page(page: Page, saved: dict[int, int]) -> None:
    """Put back the host bytes :func:`save_pages` saved for ``page``."""
    for ptr, size in zip(page.ptrs, page.sizes, strict=True):
        ctypes.memmove(ptr, saved[ptr], size)
