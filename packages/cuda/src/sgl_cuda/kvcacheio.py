"""KV cache transfers with the upstream engine's names and argument order.

Drop-in for the engine's ``kvcacheio`` transfer module (MLA forms)::

    from sgl_cuda.kvcacheio import transfer_kv_all_layer_mla, ...

Address forms (DESIGN §4), all in bytes, ``item = item_size``:

* layer-first tensor: ``base + idx * item`` (one layer's rows)
* page-first tensor:  ``base + idx * layout_dim + layer * item``
* pointer table:      ``tbl[layer] + idx * item`` (``tbl`` a ``torch.uint64`` tensor)

The ``*_mla`` functions are one Triton launch each: many rows per program,
each row moved as ``item_size // 8`` int64 words, so ``item_size`` (and any
``*_layout_dim``) must be a multiple of 8. They work for any pairing of int64
indices. The ``*_direct`` functions merge index pairs into runs where both
sides step by +1 and copy each run with one slice copy.

These are the hot path. They check only what is O(1) to check: ``item_size``
and layout dims are positive multiples of 8, indices are int64 1-D of equal
length and on the device the kernel runs on, and tensors live on a device
Triton can run on. They do **not** check that indices are in bounds or
unique, that pointer tables hold valid, 8-byte-aligned addresses of buffers
large enough for the indices, that ``num_layers`` matches the tables, or that
the buffers' row stride really is ``item_size``. Out-of-range input corrupts
memory or faults. The host pools (``sgl_cuda.CudaMLAHostPool``) check all of
that before they call in here.

Launches are stream-ordered like any CUDA op: a device -> host copy is done
when the current stream has reached it (``torch.cuda.synchronize()`` or an
event), not when the function returns.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import ModuleType

import torch

from sgl_core.backend import CopyTuning, byte_view, copy_pairs, merge_runs, tuning_for
from sgl_core.errors import (
    BackendUnavailableError,
    IndexDTypeError,
    IndexShapeError,
    LayerIndexError,
    PageAlignmentError,
    ShapeMismatchError,
)
from sgl_cuda import _copy_engine
from sgl_cuda._launch_lock import interpreter_launch

__all__ = [
    "interpreter_active",
    "start_interpreter",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
]

_triton_module: ModuleType | None = None


def _kernels() -> ModuleType:
    """Import the Triton module on first use, so ``import sgl_cuda`` stays light."""
    global _triton_module
    if _triton_module is None:
        from sgl_cuda._triton import kvcacheio as module

        _triton_module = module
    return _triton_module


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in {"1", "true", "on", "yes"}


def start_interpreter() -> str:
    """Make this process run the kernels in Triton's interpreter; says how it was turned on.

    Triton reads ``TRITON_INTERPRET`` when the kernels are defined, so once they
    were built for a GPU it is too late: ``BackendUnavailableError``.
    """
    # Read, never imported here: importing would build the kernels.
    kernels = sys.modules.get("sgl_cuda._triton.kvcacheio")
    if kernels is not None and not getattr(kernels, "INTERPRETED", False):
        raise BackendUnavailableError(
            "no CUDA device here, and its Triton kernels were already built "
            "for a GPU in this process; run it in a new process"
        )
    if _env_interpret():
        return "TRITON_INTERPRET=1 was set"
    os.environ["TRITON_INTERPRET"] = "1"  # read by Triton when the kernels are defined
    return "this run set TRITON_INTERPRET=1"


def interpreter_active() -> bool:
    """True when the transfer kernels run in Triton's interpreter (CPU tensors).

    Triton decides when the kernels are defined, so ``TRITON_INTERPRET=1`` must
    be set before the first transfer (or before this call) in the process.
    """
    if _triton_module is None and not _env_interpret():
        return False
    return bool(_kernels().INTERPRETED)


# ------------------------------------------------------------------- checks
def _words(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % 8:
        raise ShapeMismatchError(
            f"{name} must be a positive multiple of 8 bytes (rows move as int64 words), "
            f"got {value!r}"
        )
    return value // 8


def _check_indices(src_indices: torch.Tensor, dst_indices: torch.Tensor) -> torch.device:
    for name, idx in (("src_indices", src_indices), ("dst_indices", dst_indices)):
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64:
            raise IndexDTypeError(f"{name} must be a torch.int64 tensor")
        if idx.dim() != 1 or not idx.is_contiguous():
            raise IndexShapeError(f"{name} must be a contiguous 1-D tensor")
    if src_indices.numel() != dst_indices.numel():
        raise IndexShapeError(
            "src_indices and dst_indices must have equal length, "
            f"got {src_indices.numel()} and {dst_indices.numel()}"
        )
    if src_indices.device != dst_indices.device:
        raise ShapeMismatchError(
            f"src_indices is on {src_indices.device}, dst_indices on {dst_indices.device}"
        )
    device = src_indices.device
    if device.type == "cuda":
        return device
    if device.type == "cpu" and interpreter_active():
        return device
    raise BackendUnavailableError(
        f"the transfer kernels need CUDA tensors (indices are on {device}); "
        "CPU tensors work only with TRITON_INTERPRET=1"
    )


def _check_table(table: torch.Tensor, name: str, device: torch.device, layers: int) -> None:
    if not isinstance(table, torch.Tensor) or table.dtype != torch.uint64:
        raise ShapeMismatchError(f"{name} must be a torch.uint64 pointer table")
    if table.device != device:
        raise ShapeMismatchError(f"{name} is on {table.device}; the kernel runs on {device}")
    if table.dim() != 1 or not table.is_contiguous() or table.numel() < layers:
        raise ShapeMismatchError(
            f"{name} must be a contiguous 1-D table of at least {layers} entries, "
            f"got shape {tuple(table.shape)}"
        )


def _check_buffer(buf: torch.Tensor, name: str, device: torch.device) -> None:
    if not isinstance(buf, torch.Tensor):
        raise ShapeMismatchError(f"{name} must be a torch.Tensor")
    # A CUDA kernel reaches pinned host memory too (unified addressing).
    if buf.device.type != device.type and not (
        device.type == "cuda" and buf.device.type == "cpu" and buf.is_pinned()
    ):
        raise ShapeMismatchError(
            f"{name} is on {buf.device} (not pinned host memory); the kernel runs on {device}"
        )
    if buf.data_ptr() % 8:
        raise ShapeMismatchError(f"{name} must start on an 8-byte boundary")


def _check_layers(num_layers: int) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
        raise LayerIndexError(f"num_layers must be a non-negative int, got {num_layers!r}")
    return num_layers


# ------------------------------------------------------------------ kernels
def _launch(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    **params: int | bool,
) -> None:
    """One launch; rows move as int64 words, so fp8 buffers go in as bytes (tables unchanged).

    Interpreted launches hold one process-wide lock (``_launch_lock``).
    """
    kernels = _kernels()
    with interpreter_launch(bool(kernels.INTERPRETED)):
        kernels.launch_copy_rows(byte_view(src), byte_view(dst), src_indices, dst_indices, **params)


def transfer_kv_per_layer_mla(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
) -> None:
    """One layer, layer-first to layer-first: row ``src_indices[i]`` -> ``dst_indices[i]``.

    ``src``/``dst`` are the layer's buffers (rows ``item_size`` bytes apart,
    e.g. ``(tokens, 1, kv_cache_dim)``); one is usually pinned host memory.
    Unchecked: bounds, duplicates, the buffers' row stride.
    """
    words = _words(item_size, "item_size")
    device = _check_indices(src_indices, dst_indices)
    _check_buffer(src, "src", device)
    _check_buffer(dst, "dst", device)
    _launch(
        src,
        dst,
        src_indices,
        dst_indices,
        words=words,
        layer_offset=0,
        num_layers=1,
        src_row_w=words,
        src_layer_w=0,
        dst_row_w=words,
        dst_layer_w=0,
        src_table=False,
        dst_table=False,
    )


def transfer_kv_per_layer_mla_pf_lf(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
) -> None:
    """One layer, page-first ``src`` to layer-first ``dst``.

    Reads ``src_base + src_indices[i] * src_layout_dim + layer_id * item_size``,
    writes ``dst_base + dst_indices[i] * item_size``. Unchecked: bounds,
    duplicates, ``layer_id`` against the layer count of ``src``.
    """
    words = _words(item_size, "item_size")
    layout_w = _words(src_layout_dim, "src_layout_dim")
    if isinstance(layer_id, bool) or not isinstance(layer_id, int) or layer_id < 0:
        raise LayerIndexError(f"layer_id must be a non-negative int, got {layer_id!r}")
    device = _check_indices(src_indices, dst_indices)
    _check_buffer(src, "src", device)
    _check_buffer(dst, "dst", device)
    _launch(
        src,
        dst,
        src_indices,
        dst_indices,
        words=words,
        layer_offset=layer_id,
        num_layers=1,
        src_row_w=layout_w,
        src_layer_w=words,
        dst_row_w=words,
        dst_layer_w=0,
        src_table=False,
        dst_table=False,
    )


def transfer_kv_all_layer_mla(
    src_layers: torch.Tensor,
    dst_layers: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
    num_layers: int,
) -> None:
    """Every layer, pointer table to pointer table, in one launch.

    ``src_layers``/``dst_layers`` are ``torch.uint64`` tables of per-layer base
    addresses on the kernel's device: row ``tbl[layer] + idx * item_size``.
    Unchecked: the addresses themselves, bounds, duplicates.
    """
    words = _words(item_size, "item_size")
    layers = _check_layers(num_layers)
    device = _check_indices(src_indices, dst_indices)
    _check_table(src_layers, "src_layers", device, layers)
    _check_table(dst_layers, "dst_layers", device, layers)
    _launch(
        src_layers,
        dst_layers,
        src_indices,
        dst_indices,
        words=words,
        layer_offset=0,
        num_layers=layers,
        src_row_w=words,
        src_layer_w=0,
        dst_row_w=words,
        dst_layer_w=0,
        src_table=True,
        dst_table=True,
    )


def transfer_kv_all_layer_mla_lf_pf(
    src_layers: torch.Tensor,
    dst: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
) -> None:
    """Every layer, pointer table to a page-first ``dst``, in one launch.

    Reads ``src_layers[layer] + src_indices[i] * item_size``, writes
    ``dst_base + dst_indices[i] * dst_layout_dim + layer * item_size``.
    Unchecked: the table's addresses, bounds, duplicates.
    """
    words = _words(item_size, "item_size")
    layout_w = _words(dst_layout_dim, "dst_layout_dim")
    layers = _check_layers(num_layers)
    device = _check_indices(src_indices, dst_indices)
    _check_table(src_layers, "src_layers", device, layers)
    _check_buffer(dst, "dst", device)
    _launch(
        src_layers,
        dst,
        src_indices,
        dst_indices,
        words=words,
        layer_offset=0,
        num_layers=layers,
        src_row_w=words,
        src_layer_w=0,
        dst_row_w=layout_w,
        dst_layer_w=words,
        src_table=True,
        dst_table=False,
    )


# ------------------------------------------------------------------- direct
def _cpu_indices(
    src_indices: torch.Tensor, dst_indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    for name, idx in (("src_indices", src_indices), ("dst_indices", dst_indices)):
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64:
            raise IndexDTypeError(f"{name} must be a torch.int64 tensor")
        if idx.dim() != 1:
            raise IndexShapeError(f"{name} must be 1-D")
    if src_indices.numel() != dst_indices.numel():
        raise IndexShapeError(
            "src_indices and dst_indices must have equal length, "
            f"got {src_indices.numel()} and {dst_indices.numel()}"
        )
    return src_indices.to("cpu"), dst_indices.to("cpu")


def _check_page_size(page_size: int) -> int:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise PageAlignmentError(f"page_size must be a positive int, got {page_size!r}")
    return page_size


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

    Index pairs are merged into runs where both sides step by +1; each run is
    one slice copy per layer. When runs are short on average (scattered
    tokens) each layer is one gather and one scatter instead. Any pairing
    works; ``page_size`` is accepted for the upstream signature and only
    checked to be positive. Unchecked: bounds, duplicates, layer shapes.

    With CUDA >= 12.8 and long runs, every (layer, run) piece goes in one
    batched copy-engine call (``mode``: see ``sgl_cuda._copy_engine``).
    ``tuning`` (default: the device's preset, ``sgl_core.backend.tuning_for``)
    sets what counts as a short run and the cross-device copy policy.
    """
    _check_page_size(page_size)
    copy_mode = _copy_engine.resolve_mode(mode)
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
        s_dev = src_idx.to(src_list[0].device, non_blocking=True)
        d_dev = dst_idx.to(dst_list[0].device, non_blocking=True)
        for s_layer, d_layer in zip(src_list, dst_list, strict=True):
            # fp8 has no index kernels: gather and scatter its bytes
            rows = byte_view(s_layer).index_select(0, s_dev)
            # Device -> CPU must complete before the CPU scatter reads ``rows``.
            rows = rows.to(d_layer.device, non_blocking=d_layer.device.type != "cpu")
            byte_view(d_layer).index_copy_(0, d_dev, rows)
        return
    dst_blocks: list[torch.Tensor] = []
    src_blocks: list[torch.Tensor] = []
    for s_layer, d_layer in zip(src_list, dst_list, strict=True):
        for s, d, length in runs:
            dst_blocks.append(d_layer[d : d + length])
            src_blocks.append(s_layer[s : s + length])
    copy_pairs(dst_blocks, src_blocks, batched=tune.batched_cross_device)


def _page_indices(
    src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    src_idx, dst_idx = _cpu_indices(src_indices, dst_indices)
    if src_idx.numel() % page_size:
        raise PageAlignmentError(
            f"{src_idx.numel()} indices are not a whole number of pages of {page_size}"
        )
    return src_idx, dst_idx


def _layer_range(first: int, count: int) -> torch.Tensor:
    return torch.arange(first, first + count, dtype=torch.int64)


def _page_runs(
    src_idx: torch.Tensor, dst_idx: torch.Tensor, page_size: int
) -> list[tuple[int, int, int]]:
    runs = merge_runs(src_idx[::page_size], dst_idx[::page_size], unit=page_size)
    return list(runs)


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
    component). Each run of consecutive pages on both sides is one slice copy.
    Indices must be whole, aligned pages (only the count is checked here);
    unchecked: bounds, duplicates, page alignment of each run. With CUDA >= 12.8
    all pieces go in one batched copy-engine call (``mode``: see
    ``sgl_cuda._copy_engine``).
    """
    ps = _check_page_size(page_size)
    copy_mode = _copy_engine.resolve_mode(mode)
    if isinstance(layer_id, bool) or not isinstance(layer_id, int) or layer_id < 0:
        raise LayerIndexError(f"layer_id must be a non-negative int, got {layer_id!r}")
    hosts = list(src_ptrs)
    groups = _split_components(list(dst_ptrs), hosts, "dst_ptrs")
    src_idx, dst_idx = _page_indices(src_indices, dst_indices, ps)
    parts = [
        (host, _layer_range(layer_id, len(layers)), layers)
        for host, layers in zip(hosts, groups, strict=True)
    ]
    if _copy_engine.page_first(parts, src_idx, dst_idx, ps, copy_mode, to_host=False):
        return
    runs = _page_runs(src_idx, dst_idx, ps)
    dst_blocks: list[torch.Tensor] = []
    src_blocks: list[torch.Tensor] = []
    for host, layers in zip(hosts, groups, strict=True):
        for j, d_layer in enumerate(layers):
            for s, d, length in runs:
                block = host[s // ps : (s + length) // ps, layer_id + j]
                dst_blocks.append(d_layer[d : d + length].view(block.shape))
                src_blocks.append(block)
    tune = _tuning(tuning, hosts, [g[0] for g in groups if g])
    copy_pairs(dst_blocks, src_blocks, batched=tune.batched_cross_device)


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
    components); ``dst_ptrs`` the page-first-direct buffer(s). Each run of
    consecutive pages on both sides is one slice copy per layer. Unchecked:
    bounds, duplicates, page alignment of each run. With CUDA >= 12.8 all
    pieces go in one batched copy-engine call (``mode``: see
    ``sgl_cuda._copy_engine``).
    """
    ps = _check_page_size(page_size)
    copy_mode = _copy_engine.resolve_mode(mode)
    hosts = list(dst_ptrs)
    groups = _split_components(list(src_ptrs), hosts, "src_ptrs")
    src_idx, dst_idx = _page_indices(src_indices, dst_indices, ps)
    parts = [
        (host, _layer_range(0, len(layers)), layers)
        for host, layers in zip(hosts, groups, strict=True)
    ]
    if _copy_engine.page_first(parts, dst_idx, src_idx, ps, copy_mode, to_host=True):
        return
    runs = _page_runs(src_idx, dst_idx, ps)
    dst_blocks: list[torch.Tensor] = []
    src_blocks: list[torch.Tensor] = []
    for host, layers in zip(hosts, groups, strict=True):
        for j, s_layer in enumerate(layers):
            for s, d, length in runs:
                block = host[d // ps : (d + length) // ps, j]
                dst_blocks.append(block)
                src_blocks.append(s_layer[s : s + length].view(block.shape))
    tune = _tuning(tuning, [g[0] for g in groups if g], hosts)
    copy_pairs(dst_blocks, src_blocks, batched=tune.batched_cross_device)
