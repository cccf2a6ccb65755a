"""The MHA (separate K and V) transfers of ``sgl_cuda.kvcacheio``, upstream names and order.

Each function moves K and V rows in one Triton launch
(``sgl_cuda._triton.kv_mha``); ``item_size`` is one token's bytes of one
component in one layer (``head_num * head_dim * itemsize``). Address forms,
in bytes, for K and V alike (``item = item_size``, ``H = head_num``,
``ps = page_size``, ``dim = *_layout_dim``):

* layer-first tensor: ``base + idx * item`` (one layer's rows)
* page-first tensor:  ``base + idx * dim + layer * item``
* pointer table:      ``tbl[layer] + idx * item``
* page-head tensor, head ``h`` of a row (``item / H`` bytes)::

      base + (idx // ps) * ps * dim + h * ps * dim / H
           + (idx % ps) * dim / H + layer * item / H

  i.e. ``(page_num, H, ps, layers, head_dim)`` per component; the layer-first
  side holds the heads of a row back to back.

Checked like the MLA forms (O(1) only, see ``sgl_cuda.kvcacheio``), plus:
``page_size`` and ``head_num`` are positive ints, and for the page-head forms
``item_size`` and the layout dim split into ``head_num`` slices of whole
8-byte words (a head moves as int64 words). Not checked: bounds, duplicates,
the table addresses, ``num_layers`` against the tables' buffers, that K and V
have the same geometry.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from sgl_core.backend import byte_view
from sgl_cuda._kernels import kernels
from sgl_cuda._kv_checks import (
    check_buffer,
    check_head_num,
    check_indices,
    check_layer_id,
    check_layers,
    check_page_size,
    check_table,
    words,
)
from sgl_cuda._launch_lock import interpreter_launch

__all__ = [
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
]

# A side's geometry in int64 words: (row, layer, page, head strides, page_size, page_head).
_Side = tuple[int, int, int, int, int, bool]


def _plain(row_w: int, layer_w: int = 0) -> _Side:
    return (row_w, layer_w, 0, 0, 1, False)


def _page_head(item_w: int, layout_w: int, page_size: int, head_num: int) -> _Side:
    head_row_w = layout_w // head_num  # one head of one token, all layers
    return (head_row_w, item_w // head_num, page_size * layout_w, page_size * head_row_w,
            page_size, True)  # fmt: skip


def _checked_buffers(device: torch.device, **buffers: torch.Tensor) -> None:
    for name, buf in buffers.items():
        check_buffer(buf, name, device)


def _checked_tables(device: torch.device, layers: int, **tables: torch.Tensor) -> None:
    for name, table in tables.items():
        check_table(table, name, device, layers)


def _mha_kernels() -> ModuleType:
    """The Triton module, imported on first use after the MLA one.

    Both are built under the same ``TRITON_INTERPRET`` choice, and
    ``start_interpreter`` looks at the MLA module to tell whether it is too late.
    """
    kernels()
    return importlib.import_module("sgl_cuda._triton.kv_mha")


def _launch(
    src: tuple[torch.Tensor, torch.Tensor],
    dst: tuple[torch.Tensor, torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    **params: object,
) -> None:
    """One launch over K and V; ``src``/``dst`` are (K, V) buffers or tables.

    The kernel reaches V as K's address plus the distance between them (both
    8-byte aligned, checked), so K and V need no second launch.
    """
    kv_mha = _mha_kernels()
    src_k, src_v = (byte_view(t) for t in src)
    dst_k, dst_v = (byte_view(t) for t in dst)
    with interpreter_launch(bool(kv_mha.INTERPRETED)):
        kv_mha.launch_copy_kv_rows(
            src_k,
            dst_k,
            src_indices,
            dst_indices,
            src_v_delta=(src_v.data_ptr() - src_k.data_ptr()) // 8,
            dst_v_delta=(dst_v.data_ptr() - dst_k.data_ptr()) // 8,
            **params,
        )


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
    item_w = words(item_size, "item_size")
    device = check_indices(src_indices, dst_indices)
    _checked_buffers(device, src_k=src_k, dst_k=dst_k, src_v=src_v, dst_v=dst_v)
    _launch(
        (src_k, src_v),
        (dst_k, dst_v),
        src_indices,
        dst_indices,
        words=item_w,
        head_words=item_w,
        layer_offset=0,
        num_layers=1,
        src_side=_plain(item_w),
        dst_side=_plain(item_w),
        src_table=False,
        dst_table=False,
    )


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
    item_w = words(item_size, "item_size")
    layout_w = words(src_layout_dim, "src_layout_dim")
    layer = check_layer_id(layer_id)
    device = check_indices(src_indices, dst_indices)
    _checked_buffers(device, src_k=src_k, dst_k=dst_k, src_v=src_v, dst_v=dst_v)
    _launch(
        (src_k, src_v),
        (dst_k, dst_v),
        src_indices,
        dst_indices,
        words=item_w,
        head_words=item_w,
        layer_offset=layer,
        num_layers=1,
        src_side=_plain(layout_w, item_w),
        dst_side=_plain(item_w),
        src_table=False,
        dst_table=False,
    )


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
    item_w = words(item_size, "item_size")
    layout_w = words(src_layout_dim, "src_layout_dim")
    layer = check_layer_id(layer_id)
    ps = check_page_size(page_size)
    heads = check_head_num(head_num, item_size=item_size, src_layout_dim=src_layout_dim)
    device = check_indices(src_indices, dst_indices)
    _checked_buffers(device, src_k=src_k, dst_k=dst_k, src_v=src_v, dst_v=dst_v)
    _launch(
        (src_k, src_v),
        (dst_k, dst_v),
        src_indices,
        dst_indices,
        words=item_w,
        head_words=item_w // heads,
        layer_offset=layer,
        num_layers=1,
        src_side=_page_head(item_w, layout_w, ps, heads),
        dst_side=_plain(item_w),
        src_table=False,
        dst_table=False,
    )


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
    item_w = words(item_size, "item_size")
    layers = check_layers(num_layers)
    device = check_indices(src_indices, dst_indices)
    _checked_tables(
        device,
        layers,
        src_k_layers=src_k_layers,
        dst_k_layers=dst_k_layers,
        src_v_layers=src_v_layers,
        dst_v_layers=dst_v_layers,
    )
    _launch(
        (src_k_layers, src_v_layers),
        (dst_k_layers, dst_v_layers),
        src_indices,
        dst_indices,
        words=item_w,
        head_words=item_w,
        layer_offset=0,
        num_layers=layers,
        src_side=_plain(item_w),
        dst_side=_plain(item_w),
        src_table=True,
        dst_table=True,
    )


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
    item_w = words(item_size, "item_size")
    layout_w = words(dst_layout_dim, "dst_layout_dim")
    layers = check_layers(num_layers)
    device = check_indices(src_indices, dst_indices)
    _checked_tables(device, layers, src_k_layers=src_k_layers, src_v_layers=src_v_layers)
    _checked_buffers(device, dst_k=dst_k, dst_v=dst_v)
    _launch(
        (src_k_layers, src_v_layers),
        (dst_k, dst_v),
        src_indices,
        dst_indices,
        words=item_w,
        head_words=item_w,
        layer_offset=0,
        num_layers=layers,
        src_side=_plain(item_w),
        dst_side=_plain(layout_w, item_w),
        src_table=True,
        dst_table=False,
    )


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
    item_w = words(item_size, "item_size")
    layout_w = words(dst_layout_dim, "dst_layout_dim")
    layers = check_layers(num_layers)
    ps = check_page_size(page_size)
    heads = check_head_num(head_num, item_size=item_size, dst_layout_dim=dst_layout_dim)
    device = check_indices(src_indices, dst_indices)
    _checked_tables(device, layers, src_k_layers=src_k_layers, src_v_layers=src_v_layers)
    _checked_buffers(device, dst_k=dst_k, dst_v=dst_v)
    _launch(
        (src_k_layers, src_v_layers),
        (dst_k, dst_v),
        src_indices,
        dst_indices,
        words=item_w,
        head_words=item_w // heads,
        layer_offset=0,
        num_layers=layers,
        src_side=_plain(item_w),
        dst_side=_page_head(item_w, layout_w, ps, heads),
        src_table=True,
        dst_table=False,
    )
