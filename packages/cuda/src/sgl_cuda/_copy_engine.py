"""The copy-engine ``direct`` path: every (run, layer) piece of a call in one batched copy.

:func:`layer_first` and :func:`page_first` return False (and copy nothing)
when the batched copy cannot run: the mode is ``foreach``, the runtime has no
``cudaMemcpyBatchAsync`` (CUDA < 12.8, or no CUDA), a buffer is not CUDA or
pinned host memory, a layer is not contiguous, or the average piece is short;
the caller then runs its per-piece path. The address arrays (runs, pieces, the
checks before a batch) are pure CPU tensor ops over int64 addresses, no loop
per piece; the modes are in ``sgl_cuda._path_choice``, the runtime call and
its stream order in ``sgl_cuda._cudart`` (docs/design.md section 10).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch

from sgl_cuda import _cudart

__all__ = [
    "available",
    "device_of",
    "disabled_reason",
    "layer_first",
    "layer_pieces",
    "merge_adjacent",
    "page_first",
    "page_pieces",
    "token_runs",
]

# Why the batched path was switched off for this process (a runtime error), or "".
_disabled = ""


def available() -> bool:
    """Whether this process's CUDA runtime has ``cudaMemcpyBatchAsync`` (and it has not failed)."""
    if _disabled or not torch.cuda.is_available():
        return False
    rt = _cudart.runtime()
    return rt is not None and rt.has_batch


def _issue(
    pieces: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    device: torch.device,
    mode: str,
    on_device: tuple[bool, bool],
) -> None:
    """Queue ``size[i]`` bytes ``src[i] -> dst[i]`` (``pieces``) on the current stream;
    ``on_device``: whether the sources, the destinations are GPU memory."""
    rt = _cudart.runtime()
    if rt is None:
        raise RuntimeError("the CUDA runtime disappeared after the availability check")
    index = device.index if device.index is not None else torch.cuda.current_device()
    rt.queue(pieces, index, on_device, prefer_overlap=mode == "batch")


def disabled_reason() -> str:
    """The runtime error that switched the batched path off, or "" while it is on."""
    return _disabled


def _issue_or_disable(
    pieces: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    device: torch.device,
    mode: str,
    on_device: tuple[bool, bool],
) -> bool:
    """:func:`_issue`; on a runtime error switch the path off and return False.

    The caller then copies every piece its own way: copies are idempotent, so
    pieces an earlier chunk already queued are just written twice, in order.
    """
    global _disabled
    try:
        _issue(pieces, device, mode, on_device)
    except _cudart.BatchCopyError as exc:
        _disabled = str(exc)
        warnings.warn(
            f"batched copies switched off, using one copy per piece: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


# ------------------------------------------------------- address arithmetic
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
    dev_layers: Sequence[torch.Tensor],
    first: int,
    host_idx: torch.Tensor,
    dev_idx: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(host, device, bytes) of one component's pieces (``dev_layers[j]`` pairs with
    host layer ``first + j``), or None when it cannot batch."""
    if not dev_layers or host.device.type == "cuda" or not host.is_contiguous():
        return None
    row_bytes = bytes_per_row(host, 3)
    if not all(
        t.is_contiguous() and t.device.type == "cuda" and bytes_per_row(t, 1) == row_bytes
        for t in dev_layers
    ):
        return None
    pages = host_idx[::page_size] // page_size
    starts = dev_idx[::page_size]
    if pages.numel() and (
        int(pages.min()) < 0
        or int(pages.max()) >= host.shape[0]
        or first < 0
        or first + len(dev_layers) > host.shape[1]
        or not within(starts, torch.full_like(starts, page_size), dev_layers)
    ):
        return None  # the caller's slicing path raises for it
    es = host.element_size()
    layer_ids = torch.arange(first, first + len(dev_layers), dtype=torch.int64)
    host_addr = (
        host.data_ptr()
        + pages[:, None] * (host.stride(0) * es)
        + layer_ids[None, :] * (host.stride(1) * es)
    )
    return page_pieces(host_addr, bases(dev_layers), starts, row_bytes, row_bytes * page_size)


# ------------------------------------------------------------------ entries
def layer_first(
    src_layers: Sequence[torch.Tensor],
    dst_layers: Sequence[torch.Tensor],
    src_idx: torch.Tensor,
    dst_idx: torch.Tensor,
    mode: str,
    short_run_bytes: int,
) -> bool:
    """Row ``src_layers[l][src_idx[i]] -> dst_layers[l][dst_idx[i]]`` as one batch, or False.

    False too when runs average under ``short_run_bytes`` (the caller gathers).
    """
    if mode == "foreach" or not src_layers or not available():
        return False
    layers = [*src_layers, *dst_layers]
    device = device_of(layers)
    row_bytes = bytes_per_row(src_layers[0], 1)
    if device is None or not all(
        t.is_contiguous() and t.dim() >= 1 and bytes_per_row(t, 1) == row_bytes for t in layers
    ):
        return False
    runs = token_runs(src_idx, dst_idx)
    if not (within(runs[0], runs[2], src_layers) and within(runs[1], runs[2], dst_layers)):
        return False  # the caller's slicing path raises for it
    if row_bytes * src_idx.numel() // max(1, runs[0].numel()) < short_run_bytes:
        return False
    pieces = layer_pieces(bases(src_layers), bases(dst_layers), runs, row_bytes)
    on_device = (src_layers[0].device.type == "cuda", dst_layers[0].device.type == "cuda")
    return _issue_or_disable(pieces, device, mode, on_device)


def page_first(
    parts: Sequence[tuple[torch.Tensor, Sequence[torch.Tensor]]],
    first_layer: int,
    host_idx: torch.Tensor,
    dev_idx: torch.Tensor,
    page_size: int,
    mode: str,
    *,
    to_host: bool,
) -> bool:
    """Whole pages between page-first-direct host buffers and per-layer device buffers.

    Each part is ``(host, dev_layers)`` (one per component: MLA 1, K/V 2):
    ``host`` is ``(page_num, layer_num, page_size, ...)`` and ``dev_layers[j]``
    pairs with host layer ``first_layer + j``. ``host_idx`` / ``dev_idx`` are
    CPU token indices, a whole number of pages; each page's first token names
    it. All parts go in one batch; returns False (nothing copied) when any
    part cannot.
    """
    if mode == "foreach" or not parts or not available():
        return False
    pieces = [page_part(*part, first_layer, host_idx, dev_idx, page_size) for part in parts]
    ready = [p for p in pieces if p is not None]
    device = device_of([t for host, layers in parts for t in (host, *layers)])
    if device is None or len(ready) < len(parts):
        return False
    h, d, size = (torch.cat(column) for column in zip(*ready, strict=True))
    src, dst = (d, h) if to_host else (h, d)
    return _issue_or_disable(merge_adjacent(src, dst, size), device, mode, (to_host, not to_host))
