"""Address arithmetic of the copy-engine path: runs, pieces and the checks before a batch.

Pure CPU tensor ops over int64 addresses (no loop per piece, no CUDA call):
:mod:`sgl_cuda._copy_engine` builds each batch from these and issues it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "bases",
    "bytes_per_row",
    "device_of",
    "layer_pieces",
    "merge_adjacent",
    "page_part",
    "page_pieces",
    "token_runs",
    "within",
]


# -------------------------------------------------------------- piece arrays
def token_runs(
    src: torch.Tensor, dst: torch.Tensor, unit: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Maximal runs where both CPU int64 index tensors step by ``unit``: (src, dst, count)."""
    n = src.numel()
    if n == 0:
        empty = torch.empty(0, dtype=torch.int64)
        return empty, empty, empty
    brk = (src[1:] - src[:-1] != unit) | (dst[1:] - dst[:-1] != unit)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(brk).flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([n], dtype=torch.int64)])
    return src[starts], dst[starts], ends - starts


def merge_adjacent(
    src: torch.Tensor, dst: torch.Tensor, size: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Join each piece to the previous one when both its addresses continue it."""
    if src.numel() < 2:
        return src, dst, size
    ends = src[:-1] + size[:-1]
    cont = src[1:] == ends
    if not bool(cont.any()):  # the usual case: nothing to join, no more passes
        return src, dst, size
    cont &= dst[1:] == dst[:-1] + size[:-1]
    if not bool(cont.any()):
        return src, dst, size
    first = torch.cat([torch.ones(1, dtype=torch.bool), ~cont])
    seg = torch.cumsum(first.to(torch.int64), 0) - 1
    merged = torch.zeros(int(seg[-1]) + 1, dtype=torch.int64).index_add_(0, seg, size)
    return src[first].contiguous(), dst[first].contiguous(), merged


def layer_pieces(
    src_bases: torch.Tensor,
    dst_bases: torch.Tensor,
    runs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    row_bytes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, dst, bytes) of every (layer, run), layer-major; rows ``row_bytes`` apart."""
    rs, rd, count = runs
    src = (src_bases[:, None] + rs[None, :] * row_bytes).flatten()
    dst = (dst_bases[:, None] + rd[None, :] * row_bytes).flatten()
    size = (count * row_bytes).expand(src_bases.numel(), -1).flatten()
    return merge_adjacent(src, dst, size)


def page_pieces(
    host_page_addr: torch.Tensor,
    dev_bases: torch.Tensor,
    dev_starts: torch.Tensor,
    row_bytes: int,
    page_bytes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(host, device, bytes) of every (page, layer), page-major.

    ``host_page_addr`` is ``(pages, layers)``: the address of each page's block
    of each layer; ``dev_bases`` ``(layers,)`` the device layer bases;
    ``dev_starts`` ``(pages,)`` the first device token of each page.
    """
    host = host_page_addr.flatten()
    dev = (dev_starts[:, None] * row_bytes + dev_bases[None, :]).flatten()
    size = torch.full_like(host, page_bytes)
    return host, dev, size


# ------------------------------------------------------------------ checks
def device_of(tensors: Sequence[torch.Tensor]) -> torch.device | None:
    """The one CUDA device of ``tensors`` if each is on it or pinned host memory."""
    device: torch.device | None = None
    for t in tensors:
        if t.device.type == "cuda":
            if device is not None and t.device != device:
                return None
            device = t.device
        elif t.device.type != "cpu" or not t.is_pinned():
            return None
    return device


def bytes_per_row(t: torch.Tensor, lead: int) -> int:
    """Bytes of one row: the dims after the ``lead`` leading ones (no view is made)."""
    return math.prod(t.shape[lead:]) * t.element_size()


def within(starts: torch.Tensor, counts: torch.Tensor, layers: Sequence[torch.Tensor]) -> bool:
    """Whether every run ``[start, start + count)`` lies inside every layer's rows."""
    if starts.numel() == 0:
        return True
    rows = min(t.shape[0] for t in layers)
    return int(starts.min()) >= 0 and int((starts + counts).max()) <= rows


def bases(layers: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64)


def page_part(
    host: torch.Tensor,
    layer_ids: torch.Tensor,
    dev_layers: Sequence[torch.Tensor],
    host_idx: torch.Tensor,
    dev_idx: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(host, device, bytes) of one component's pieces, or None when it cannot batch."""
    if not dev_layers or host.device.type == "cuda" or not host.is_contiguous():
        return None
    if not all(t.is_contiguous() and t.device.type == "cuda" for t in dev_layers):
        return None
    es = host.element_size()
    row_bytes = bytes_per_row(host, 3)
    if any(bytes_per_row(t, 1) != row_bytes for t in dev_layers):
        return None
    pages = host_idx[::page_size] // page_size
    starts = dev_idx[::page_size]
    if pages.numel() and (
        int(pages.min()) < 0
        or int(pages.max()) >= host.shape[0]
        or int(layer_ids.min()) < 0
        or int(layer_ids.max()) >= host.shape[1]
        or not within(starts, torch.full_like(starts, page_size), dev_layers)
    ):
        return None  # the caller's slicing path raises for it
    host_addr = (
        host.data_ptr()
        + pages[:, None] * (host.stride(0) * es)
        + layer_ids[None, :] * (host.stride(1) * es)
    )
    return page_pieces(host_addr, bases(dev_layers), starts, row_bytes, row_bytes * page_size)
