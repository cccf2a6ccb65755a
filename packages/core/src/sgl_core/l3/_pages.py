"""Resolve ``(keys, host_indices)`` into per-page memory objects of a host pool."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import torch

from sgl_core._protocols import MLAHostPool
from sgl_core.l3._errors import PageStoreArgumentError, PageStoreNotReadyError

__all__ = ["PageObjects", "check_keys", "object_key", "objects_per_page", "resolve_pages"]


@dataclasses.dataclass(frozen=True)
class PageObjects:
    """One page: its key, host token start, and its objects' keys, addresses, sizes."""

    key: str
    start: int
    object_keys: tuple[str, ...]
    ptrs: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


def object_key(page_key: str, index: int, count: int) -> str:
    """Store key of object ``index`` of ``count`` of a page.

    The count is part of the key, so pools whose layouts split a page
    differently never read each other's objects as their own.
    """
    return f"{page_key}#{index}of{count}"


def objects_per_page(host: MLAHostPool) -> int:
    """Objects per page of ``host``, from ``get_page_buffer_meta`` of its first page."""
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(host.page_size, dtype=torch.int64))
    if not ptrs or len(ptrs) != len(sizes):
        raise PageStoreArgumentError(
            f"host.get_page_buffer_meta returned {len(ptrs)} pointers and {len(sizes)} sizes "
            "for one page"
        )
    return len(ptrs)


def _index_list(host_indices: torch.Tensor | Sequence[int]) -> torch.Tensor:
    if isinstance(host_indices, torch.Tensor):
        if host_indices.dim() != 1:
            raise PageStoreArgumentError(
                f"host_indices must be 1-D, got shape {tuple(host_indices.shape)}"
            )
        return host_indices.detach().to("cpu", torch.int64)
    return torch.tensor(list(host_indices), dtype=torch.int64)


def check_keys(keys: Sequence[str]) -> list[str]:
    """Validate ``keys`` (non-empty strings, no duplicates) and return them as a list."""
    if isinstance(keys, str):
        raise PageStoreArgumentError("keys must be a sequence of str, got one str")
    out = list(keys)
    for k in out:
        if not isinstance(k, str) or not k:
            raise PageStoreArgumentError(f"keys must be non-empty str, got {k!r}")
    dup = [k for k, n in Counter(out).items() if n > 1]
    if dup:
        raise PageStoreArgumentError(f"keys holds duplicates, e.g. {dup[0]!r}")
    return out


def resolve_pages(
    host: MLAHostPool | None,
    n_objects: int,
    keys: Sequence[str],
    host_indices: torch.Tensor | Sequence[int],
) -> list[PageObjects]:
    """Pair each key with its page's objects; raise on anything but whole pages, one per key."""
    if host is None:
        raise PageStoreNotReadyError("call register_host_pool(host) before moving pages")
    key_list = check_keys(keys)
    idx = _index_list(host_indices)
    ps = host.page_size
    if idx.numel() != len(key_list) * ps:
        raise PageStoreArgumentError(
            f"host_indices has {idx.numel()} token indices; {len(key_list)} keys need "
            f"{len(key_list) * ps} (page_size={ps}, one page per key)"
        )
    if not key_list:
        return []
    starts: list[int] = idx[::ps].tolist()
    if len(set(starts)) != len(starts):
        raise PageStoreArgumentError("host_indices names the same host page twice")
    try:
        ptrs, sizes = host.get_page_buffer_meta(idx)
    except (ValueError, IndexError) as exc:
        raise PageStoreArgumentError(f"host_indices: {exc}") from exc
    pages = len(key_list)
    if len(ptrs) != pages * n_objects or len(sizes) != len(ptrs):
        raise PageStoreArgumentError(
            f"host.get_page_buffer_meta returned {len(ptrs)} objects for {pages} pages; "
            f"expected {n_objects} per page"
        )
    out = []
    for p, key in enumerate(key_list):
        lo, hi = p * n_objects, (p + 1) * n_objects
        out.append(
            PageObjects(
                key=key,
                start=starts[p],
                object_keys=tuple(object_key(key, j, n_objects) for j in range(n_objects)),
                ptrs=tuple(int(x) for x in ptrs[lo:hi]),
                sizes=tuple(int(x) for x in sizes[lo:hi]),
            )
        )
    return out
