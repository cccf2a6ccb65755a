"""KV cache transfers with the upstream engine's names and argument order.

Drop-in for the engine's ``kvcacheio`` transfer module (MLA, MHA and direct
forms; address forms, checks and byte orders: docs/design.md sections 5 and
6). The ``*_mla`` and MHA functions are one Triton launch each, rows moved as
``item_size // 8`` int64 words; the ``*_direct`` functions are slice copies
(``sgl_cuda._direct``, re-exported here).

These are the hot path and check only what is O(1) to check. They do **not**
check that indices are in bounds or unique, that pointer tables hold valid,
8-byte-aligned addresses of buffers large enough for the indices, that
``num_layers`` matches the tables, that K and V have the same geometry, or
that the buffers' row stride really is ``item_size``: out-of-range input
corrupts memory or faults. The host pools (``sgl_cuda.CudaMLAHostPool``)
check all of that first. Launches are stream-ordered like any CUDA op.
"""

from __future__ import annotations

import torch

from sgl_core.backend import publish_names
from sgl_cuda._direct import (
    transfer_kv_all_layer_direct_lf_pf,
    transfer_kv_direct,
    transfer_kv_per_layer_direct_pf_lf,
)
from sgl_cuda._kernels import interpreter_active, interpreter_launch, start_interpreter
from sgl_cuda._kv_checks import RowForm, bind_rows
from sgl_cuda._kv_checks import check_layer_id as _check_layer_id

__all__ = [
    "interpreter_active",
    "start_interpreter",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
]


def _rows(
    src: tuple[torch.Tensor, ...],
    dst: tuple[torch.Tensor, ...],
    indices: tuple[torch.Tensor, torch.Tensor],
    item_size: int,
    forms: tuple[RowForm, RowForm],
    layer_offset: int = 0,
    num_layers: int = 1,
) -> None:
    """One checked launch of MLA ``(row,)`` or MHA ``(K, V)``; fp8 buffers go in as bytes."""
    launch, interpreted = bind_rows(
        src,
        dst,
        *indices,
        item_size=item_size,
        src_form=forms[0],
        dst_form=forms[1],
        layer_offset=layer_offset,
        num_layers=num_layers,
        labels=("",) if len(src) == 1 else ("k", "v"),
    )
    with interpreter_launch(interpreted):
        launch(*indices)


def transfer_kv_per_layer_mla(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
) -> None:
    """One layer, layer-first to layer-first: row ``src_indices[i]`` -> ``dst_indices[i]``."""
    forms = RowForm("layer_first", "src"), RowForm("layer_first", "dst")
    _rows((src,), (dst,), (src_indices, dst_indices), item_size, forms)


def transfer_kv_per_layer_mla_pf_lf(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
) -> None:
    """Layer ``layer_id`` of a page-first ``src`` into a layer-first ``dst``."""
    layer = _check_layer_id(layer_id)
    forms = RowForm("page_first", "src", src_layout_dim), RowForm("layer_first", "dst")
    _rows((src,), (dst,), (src_indices, dst_indices), item_size, forms, layer)


def transfer_kv_all_layer_mla(
    src_layers: torch.Tensor,
    dst_layers: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
    num_layers: int,
) -> None:
    """Every layer, pointer table to pointer table (``torch.uint64``), in one launch."""
    forms = RowForm("table", "src"), RowForm("table", "dst")
    _rows((src_layers,), (dst_layers,), (src_indices, dst_indices), item_size, forms, 0, num_layers)


def transfer_kv_all_layer_mla_lf_pf(
    src_layers: torch.Tensor,
    dst: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
) -> None:
    """Every layer, pointer table to a page-first ``dst``, in one launch."""
    forms = RowForm("table", "src"), RowForm("page_first", "dst", dst_layout_dim)
    _rows((src_layers,), (dst,), (src_indices, dst_indices), item_size, forms, 0, num_layers)


def transfer_kv_per_layer(
    src_k: torch.Tensor,
    dst_k: torch.Tensor,
    src_v: torch.Tensor,
    dst_v: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
) -> None:
    """One layer, layer-first to layer-first, K and V: ``src_indices[i]`` -> ``dst_indices[i]``."""
    forms = RowForm("layer_first", "src"), RowForm("layer_first", "dst")
    _rows((src_k, src_v), (dst_k, dst_v), (src_indices, dst_indices), item_size, forms)


def transfer_kv_per_layer_pf_lf(
    src_k: torch.Tensor,
    dst_k: torch.Tensor,
    src_v: torch.Tensor,
    dst_v: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
) -> None:
    """Layer ``layer_id`` of page-first ``src_k``/``src_v`` into layer-first ``dst_k``/``dst_v``."""
    forms = RowForm("page_first", "src", src_layout_dim), RowForm("layer_first", "dst")
    src, dst = (src_k, src_v), (dst_k, dst_v)
    _rows(src, dst, (src_indices, dst_indices), item_size, forms, _check_layer_id(layer_id))


def transfer_kv_per_layer_ph_lf(
    src_k: torch.Tensor,
    dst_k: torch.Tensor,
    src_v: torch.Tensor,
    dst_v: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    item_size: int,
    src_layout_dim: int,
    page_size: int,
    head_num: int,
) -> None:
    """Layer ``layer_id`` of page-head ``src_k``/``src_v`` into layer-first ``dst_k``/``dst_v``."""
    forms = (
        RowForm("page_head", "src", src_layout_dim, page_size, head_num),
        RowForm("layer_first", "dst"),
    )
    src, dst = (src_k, src_v), (dst_k, dst_v)
    _rows(src, dst, (src_indices, dst_indices), item_size, forms, _check_layer_id(layer_id))


def transfer_kv_all_layer(
    src_k_layers: torch.Tensor,
    dst_k_layers: torch.Tensor,
    src_v_layers: torch.Tensor,
    dst_v_layers: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
    num_layers: int,
) -> None:
    """Every layer, K and V, pointer tables to pointer tables (``torch.uint64``), one launch."""
    forms = RowForm("table", "src"), RowForm("table", "dst")
    src, dst = (src_k_layers, src_v_layers), (dst_k_layers, dst_v_layers)
    _rows(src, dst, (src_indices, dst_indices), item_size, forms, 0, num_layers)


def transfer_kv_all_layer_lf_pf(
    src_k_layers: torch.Tensor,
    dst_k: torch.Tensor,
    src_v_layers: torch.Tensor,
    dst_v: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
) -> None:
    """Every layer, K and V, pointer tables to page-first ``dst_k``/``dst_v``, one launch."""
    forms = RowForm("table", "src"), RowForm("page_first", "dst", dst_layout_dim)
    src, dst = (src_k_layers, src_v_layers), (dst_k, dst_v)
    _rows(src, dst, (src_indices, dst_indices), item_size, forms, 0, num_layers)


def transfer_kv_all_layer_lf_ph(
    src_k_layers: torch.Tensor,
    dst_k: torch.Tensor,
    src_v_layers: torch.Tensor,
    dst_v: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    item_size: int,
    dst_layout_dim: int,
    num_layers: int,
    page_size: int,
    head_num: int,
) -> None:
    """Every layer, K and V, pointer tables to page-head ``dst_k``/``dst_v``, one launch."""
    forms = (
        RowForm("table", "src"),
        RowForm("page_head", "dst", dst_layout_dim, page_size, head_num),
    )
    src, dst = (src_k_layers, src_v_layers), (dst_k, dst_v)
    _rows(src, dst, (src_indices, dst_indices), item_size, forms, 0, num_layers)


publish_names(__name__, globals())  # the kernels' entry points report sgl_cuda.kvcacheio
