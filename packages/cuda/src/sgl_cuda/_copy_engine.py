"""The copy-engine ``direct`` path: every (run, layer) piece of a call in one batched copy.

:func:`layer_first` and :func:`page_first` return False (and copy nothing)
when the batched copy cannot run: the mode is ``foreach``, the runtime has no
``cudaMemcpyBatchAsync`` (CUDA < 12.8, or no CUDA), a buffer is not CUDA or
pinned host memory, a layer is not contiguous, or the average piece is short;
the caller then runs its per-piece path. The batch is queued on the current
stream, or on a side stream ordered both ways with it when that is the legacy
NULL stream (refused by the API). Opt-in: tested on CPU against a fake runtime.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Sequence

import torch

from sgl_core.errors import ShapeMismatchError
from sgl_cuda import _cudart
from sgl_cuda._copy_pieces import (
    bases,
    bytes_per_row,
    device_of,
    layer_pieces,
    merge_adjacent,
    page_part,
    page_pieces,
    token_runs,
    within,
)

__all__ = [
    "MODES",
    "MOVER_MODES",
    "available",
    "disabled_reason",
    "layer_first",
    "layer_pieces",
    "merge_adjacent",
    "page_first",
    "page_pieces",
    "resolve_mode",
    "token_runs",
]

MODES = ("batch", "batch-plain", "foreach")
#: The host pools' ``direct`` movers also take ``auto``: the path chosen by measurement
#: (``sgl_cuda._path_choice``).
MOVER_MODES = (*MODES, "auto")
_ENV = "SGL_CUDA_DIRECT_COPY"
# Copies per runtime call: bounds the arrays the driver walks in one call.
MAX_BATCH = 1 << 14
_side_lock = threading.Lock()
# Why the batched path was switched off for this process (a runtime error), or "".
_disabled = ""
_side_streams: dict[int, torch.cuda.Stream] = {}


def resolve_mode(mode: str | None, *, movers: bool = False) -> str:
    """``mode``, else ``$SGL_CUDA_DIRECT_COPY``, else ``foreach``; checked against MODES
    (``movers``: MOVER_MODES, which add ``auto``).

    ``foreach`` stays the default until the batched modes have run on a GPU
    (``scripts/gpu_check.sh`` measures and tests all of them); ``batch`` and
    ``auto`` are opt-in.
    """
    chosen = mode if mode is not None else os.environ.get(_ENV, "").strip().lower() or "foreach"
    allowed = MOVER_MODES if movers else MODES
    if chosen not in allowed:
        raise ShapeMismatchError(f"direct copy mode must be one of {allowed}, got {chosen!r}")
    return chosen


def available() -> bool:
    """Whether this process's CUDA runtime has ``cudaMemcpyBatchAsync`` (and it has not failed)."""
    if _disabled or not torch.cuda.is_available():
        return False
    rt = _cudart.runtime()
    return rt is not None and rt.has_batch


def _issue(
    src: torch.Tensor,
    dst: torch.Tensor,
    size: torch.Tensor,
    device: torch.device,
    mode: str,
    *,
    src_on_device: bool,
    dst_on_device: bool,
) -> None:
    rt = _cudart.runtime()
    if rt is None:
        raise RuntimeError("the CUDA runtime disappeared after the availability check")
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        current = torch.cuda.current_stream(index)
        stream = current
        if current.cuda_stream == 0:  # the legacy stream: the API refuses it
            stream = _side_stream(index)
            stream.wait_stream(current)
        src, dst, size = src.contiguous(), dst.contiguous(), size.contiguous()
        try:
            for lo in range(0, size.numel(), MAX_BATCH):
                hi = lo + MAX_BATCH
                rt.memcpy_batch(
                    dst[lo:hi],
                    src[lo:hi],
                    size[lo:hi],
                    stream.cuda_stream,
                    device_index=index,
                    src_on_device=src_on_device,
                    dst_on_device=dst_on_device,
                    prefer_overlap=mode == "batch",
                )
        finally:
            # Also after a failed chunk: chunks already queued stay ordered before
            # whatever the current stream does next (e.g. the per-piece fallback).
            if stream is not current:
                current.wait_stream(stream)


def disabled_reason() -> str:
    """The runtime error that switched the batched path off, or "" while it is on."""
    return _disabled


def _issue_or_disable(
    src: torch.Tensor,
    dst: torch.Tensor,
    size: torch.Tensor,
    device: torch.device,
    mode: str,
    *,
    src_on_device: bool,
    dst_on_device: bool,
) -> bool:
    """Queue the batch; on a runtime error switch the path off and return False.

    The caller then copies every piece its own way: copies are idempotent, so
    pieces an earlier chunk already queued are just written twice, in order.
    """
    global _disabled
    try:
        _issue(
            src, dst, size, device, mode, src_on_device=src_on_device, dst_on_device=dst_on_device
        )
    except _cudart.BatchCopyError as exc:
        _disabled = str(exc)
        warnings.warn(
            f"batched copies switched off, using one copy per piece: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def _side_stream(index: int) -> torch.cuda.Stream:
    with _side_lock:
        stream = _side_streams.get(index)
        if stream is None:
            stream = torch.cuda.Stream(index)  # type: ignore[no-untyped-call]
            _side_streams[index] = stream
        return stream


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
    if device is None or not all(t.is_contiguous() and t.dim() >= 1 for t in layers):
        return False
    row_bytes = bytes_per_row(src_layers[0], 1)
    if any(bytes_per_row(t, 1) != row_bytes for t in layers):
        return False
    runs = token_runs(src_idx, dst_idx)
    if not (within(runs[0], runs[2], src_layers) and within(runs[1], runs[2], dst_layers)):
        return False  # the caller's slicing path raises for it
    if row_bytes * src_idx.numel() // max(1, runs[0].numel()) < short_run_bytes:
        return False
    src, dst, size = layer_pieces(bases(src_layers), bases(dst_layers), runs, row_bytes)
    return _issue_or_disable(
        src,
        dst,
        size,
        device,
        mode,
        src_on_device=src_layers[0].device.type == "cuda",
        dst_on_device=dst_layers[0].device.type == "cuda",
    )


def page_first(
    parts: Sequence[tuple[torch.Tensor, torch.Tensor, Sequence[torch.Tensor]]],
    host_idx: torch.Tensor,
    dev_idx: torch.Tensor,
    page_size: int,
    mode: str,
    *,
    to_host: bool,
) -> bool:
    """Whole pages between page-first-direct host buffers and per-layer device buffers.

    Each part is ``(host, layer_ids, dev_layers)`` (one per component: MLA 1,
    K/V 2): ``host`` is ``(page_num, layer_num, page_size, ...)`` and
    ``dev_layers[j]`` pairs with host layer ``layer_ids[j]``. ``host_idx`` /
    ``dev_idx`` are CPU token indices, a whole number of pages; each page's
    first token names it. All parts go in one batch; returns False (nothing
    copied) when any part cannot.
    """
    if mode == "foreach" or not parts or not available():
        return False
    pieces = [page_part(*part, host_idx, dev_idx, page_size) for part in parts]
    device = device_of([t for host, _, layers in parts for t in (host, *layers)])
    if device is None or any(p is None for p in pieces):
        return False
    h = torch.cat([p[0] for p in pieces if p is not None])
    d = torch.cat([p[1] for p in pieces if p is not None])
    size = torch.cat([p[2] for p in pieces if p is not None])
    if to_host:
        src, dst, size = merge_adjacent(d, h, size)
    else:
        src, dst, size = merge_adjacent(h, d, size)
    return _issue_or_disable(
        src, dst, size, device, mode, src_on_device=to_host, dst_on_device=not to_host
    )
