"""On-disk pieces of :class:`~sgl_core.l3.FilePageStore`: names, temp files, raw I/O.

Page files are ``<root>/pages/<xx>/<64 hex digits>``; temp files end in
``.tmp`` and are ``flock``-ed by their writer until the rename, which is how a
store tells a live writer's temp file from one whose writer died.
``<root>/store.lock``: docs/design.md section 8, "One capacity per root".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path

from sgl_core.l3._protocol import (
    PageStoreArgumentError,
    PageStoreRootError,
    PageStoreRootInUseError,
)

__all__ = ["PAGE_NAME", "TMP_SUFFIX", "check_root", "fsync_dir", "hold_root", "tmp_state"]

PAGE_NAME = re.compile(r"[0-9a-f]{64}")
TMP_SUFFIX = ".tmp"


def check_root(root: object) -> Path:
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


def hold_root(root: Path, *, exclusive: bool) -> int:
    """An fd of ``<root>/store.lock`` holding its ``flock`` (the kernel drops it with the process).

    ``exclusive`` (a bounded store) needs the root alone; otherwise other
    unbounded stores may hold it too. ``PageStoreRootInUseError`` when not.
    """
    path = root / "store.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise PageStoreRootError(f"cannot use {str(root)!r} as an L3 root: {exc}") from exc
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        held = "held by another live store" if exclusive else "held by a live bounded store"
        raise PageStoreRootInUseError(
            f"L3 root {str(root)!r} is {held}: a store with capacity_bytes needs its root "
            "alone (the capacity bounds the whole directory); give each bounded store its "
            "own root, or close() the other store"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise PageStoreRootError(f"cannot lock {str(path)!r}: {exc}") from exc
    return fd


def tmp_state(path: Path) -> int | None:
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


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
