"""The ``*_direct`` transfers of ``sgl_cuda.kvcacheio``: slice copies, no kernels.

The copy paths are the ``direct`` io's (docs/design.md section 6): ``tuning``
(a ``CopyTuning``, default the accelerator side's preset) picks among them, an
opt-in ``mode`` makes them one batched copy-engine call (``sgl_cuda._copy_engine``).
Checked: what is O(1) to check; unchecked: bounds, duplicates, layer shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sgl_core.backend import CopyTuning, RunSide, copy_runs, gather_rows, merge_runs, tuning_for
from sgl_core.errors import PageAlignmentError, ShapeMismatchError
from sgl_cuda import _copy_engine
from sgl_cuda._kv_checks import check_index_pair, check_layer_id, check_page_size
from sgl_cuda._path_choice import resolve_mode

__all__ = [
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
]


def _cpu_indices(
    src_indices: torch.Tensor, dst_indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    check_index_pair(src_indices, dst_indices, contiguous=False)
    return src_indices.to("cpu"), dst_indices.to("cpu")


def _tuning(
    tuning: CopyTuning | None, src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor]
) -> CopyTuning:
    """``tuning``, else the preset of the accelerator side (CPU when both are on the CPU)."""
    if tuning is not None:
        return tuning
    devices = [t.device for t in (*src[:1], *dst[:1]) if t.device.type != "cpu"]
    return tuning_for(devices[0] if devices else torch.device("cpu"))


def transfer_kv_direct(
    src_layers: Sequence[torch.Tensor],
    dst_layers: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
    *,
    mode: str | None = None,
    tuning: CopyTuning | None = None,
) -> None:
    """Row ``src_layers[l][src_indices[i]]`` -> ``dst_layers[l][dst_indices[i]]`` for every l.

    Any pairing works; ``page_size`` is accepted for the upstream signature
    and only checked to be positive.
    """
    check_page_size(page_size, PageAlignmentError)
    copy_mode = resolve_mode(mode)
    src_list, dst_list = list(src_layers), list(dst_layers)
    if len(src_list) != len(dst_list):
        raise ShapeMismatchError(
            f"src_layers has {len(src_list)} layers, dst_layers {len(dst_list)}"
        )
    src_idx, dst_idx = _cpu_indices(src_indices, dst_indices)
    n = src_idx.numel()
    if n == 0 or not src_list:
        return
    tune = _tuning(tuning, src_list, dst_list)
    short = tune.gather_below_run_bytes
    if _copy_engine.layer_first(src_list, dst_list, src_idx, dst_idx, copy_mode, short):
        return
    runs = merge_runs(src_idx, dst_idx)
    row_bytes = src_list[0][0].numel() * src_list[0].element_size()
    if row_bytes * n // len(runs) < short:
        # Only host -> device may go async: a CPU scatter reads the gathered rows next.
        gather_rows(dst_list, src_list, dst_idx, src_idx, non_blocking=True)
        return
    pairs = [(RunSide(s), RunSide(d)) for s, d in zip(src_list, dst_list, strict=True)]
    copy_runs(runs, pairs, into_first=False, batched=tune.batched_cross_device)


def _pages(
    per_layer: Sequence[torch.Tensor],
    paged: Sequence[torch.Tensor],
    indices: tuple[torch.Tensor, torch.Tensor],
    page_size: int,
    options: tuple[str | None, CopyTuning | None],
    first: int,
    to_host: bool,
) -> None:
    """Whole pages between page-first-direct ``paged`` and per-layer ``per_layer``
    buffers (from layer ``first``), grouped by component (MLA: 1; K/V: 2,
    ``k_layers + v_layers``)."""
    ps = check_page_size(page_size, PageAlignmentError)
    copy_mode = resolve_mode(options[0])
    check_layer_id(first)
    hosts, layers = list(paged), list(per_layer)
    parts = len(hosts)
    if parts == 0 or len(layers) % parts:
        what = "src_ptrs" if to_host else "dst_ptrs"
        raise ShapeMismatchError(
            f"{what}: {len(layers)} per-layer buffers do not split over {parts} page-first buffers"
        )
    per = len(layers) // parts
    groups = [layers[c * per : (c + 1) * per] for c in range(parts)]
    src_idx, dst_idx = _cpu_indices(*indices)
    if src_idx.numel() % ps:
        raise PageAlignmentError(
            f"{src_idx.numel()} indices are not a whole number of pages of {ps}"
        )
    host_idx, dev_idx = (dst_idx, src_idx) if to_host else (src_idx, dst_idx)
    pieces = list(zip(hosts, groups, strict=True))
    if _copy_engine.page_first(pieces, first, host_idx, dev_idx, ps, copy_mode, to_host=to_host):
        return
    runs = merge_runs(src_idx[::ps], dst_idx[::ps], unit=ps)
    pairs = []
    for host, group in pieces:
        for j, layer in enumerate(group):
            h, dev = RunSide(host[:, first + j], unit=ps), RunSide(layer, page=ps)
            pairs.append((dev, h) if to_host else (h, dev))
    devs = [g[0] for g in groups if g]
    tune = _tuning(options[1], *((devs, hosts) if to_host else (hosts, devs)))
    copy_runs(runs, pairs, into_first=False, batched=tune.batched_cross_device)


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
    *,
    mode: str | None = None,
    tuning: CopyTuning | None = None,
) -> None:
    """Page-first-direct host -> per-layer device, whole pages, from layer ``layer_id``.

    ``src_ptrs`` holds the page-first-direct buffer(s) ``(page_num, layer_num,
    page_size, ...)`` (one for MLA); ``dst_ptrs`` the per-layer destination
    buffer(s) for layers ``layer_id, layer_id + 1, ...`` (one per layer and
    component). Indices must be whole, aligned pages (only the count is checked).
    """
    indices = (src_indices, dst_indices)
    _pages(dst_ptrs, src_ptrs, indices, page_size, (mode, tuning), layer_id, to_host=False)


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
    *,
    mode: str | None = None,
    tuning: CopyTuning | None = None,
) -> None:
    """Per-layer device -> page-first-direct host, every layer, whole pages.

    ``src_ptrs`` holds the per-layer buffers (``k_layers + v_layers`` for two
    components); ``dst_ptrs`` the page-first-direct buffer(s).
    """
    indices = (src_indices, dst_indices)
    _pages(src_ptrs, dst_ptrs, indices, page_size, (mode, tuning), 0, to_host=True)
