"""The ``*_direct`` transfers of ``sgl_cuda.kvcacheio``: slice copies, no kernels.

Index pairs merge into runs where both sides step by +1 (whole pages for the
page-first-direct forms): one slice copy per run and layer, or one
gather/scatter per layer when runs are short (``tuning``: a ``CopyTuning``,
default the accelerator side's preset); with CUDA >= 12.8 and an opt-in
``mode`` (``sgl_cuda._copy_engine``) one batched copy-engine call. Checked:
what is O(1) to check; unchecked: bounds, duplicates, layer shapes.
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


def _split_components(
    per_layer: list[torch.Tensor], paged: list[torch.Tensor], what: str
) -> list[list[torch.Tensor]]:
    """Group per-layer buffers by component (MLA: 1; K/V: 2, ``k_layers + v_layers``)."""
    parts = len(paged)
    if parts == 0 or len(per_layer) % parts:
        raise ShapeMismatchError(
            f"{what}: {len(per_layer)} per-layer buffers do not split over "
            f"{parts} page-first buffers"
        )
    per = len(per_layer) // parts
    return [per_layer[c * per : (c + 1) * per] for c in range(parts)]


def _pages(
    hosts: list[torch.Tensor],
    groups: list[list[torch.Tensor]],
    indices: tuple[torch.Tensor, torch.Tensor],
    ps: int,
    options: tuple[str, CopyTuning | None],
    first: int,
    to_host: bool,
) -> None:
    """Whole pages between page-first-direct ``hosts`` and per-layer ``groups`` (from ``first``)."""
    src_idx, dst_idx = _cpu_indices(*indices)
    if src_idx.numel() % ps:
        raise PageAlignmentError(
            f"{src_idx.numel()} indices are not a whole number of pages of {ps}"
        )
    parts = list(zip(hosts, groups, strict=True))
    host_idx, dev_idx = (dst_idx, src_idx) if to_host else (src_idx, dst_idx)
    if _copy_engine.page_first(parts, first, host_idx, dev_idx, ps, options[0], to_host=to_host):
        return
    runs = merge_runs(src_idx[::ps], dst_idx[::ps], unit=ps)
    pairs = []
    for host, layers in zip(hosts, groups, strict=True):
        for j, layer in enumerate(layers):
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
    ps = check_page_size(page_size, PageAlignmentError)
    copy_mode = resolve_mode(mode)
    check_layer_id(layer_id)
    hosts = list(src_ptrs)
    groups = _split_components(list(dst_ptrs), hosts, "dst_ptrs")
    indices = (src_indices, dst_indices)
    _pages(hosts, groups, indices, ps, (copy_mode, tuning), layer_id, to_host=False)


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
    ps = check_page_size(page_size, PageAlignmentError)
    copy_mode = resolve_mode(mode)
    hosts = list(dst_ptrs)
    groups = _split_components(list(src_ptrs), hosts, "src_ptrs")
    _pages(hosts, groups, (src_indices, dst_indices), ps, (copy_mode, tuning), 0, to_host=True)
