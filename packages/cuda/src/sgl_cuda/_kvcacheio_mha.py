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

import functools
import importlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from sgl_core.backend import byte_view
from sgl_cuda._kernels import kernels
from sgl_cuda._kv_checks import RowForm, check_layer_id, check_rows
from sgl_cuda._launch_lock import interpreter_launch

__all__ = [
    "RowForm",
    "bind_rows",
    "prepare_rows",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
]


def bind_rows(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    *,
    item_size: int,
    src_form: RowForm,
    dst_form: RowForm,
    layer_offset: int = 0,
    num_layers: int = 1,
) -> tuple[Callable[[torch.Tensor, torch.Tensor], None], bool]:
    """Check a launch for ``(K,)`` or ``(K, V)`` buffers (or tables) of one row size now.

    Returns the launch bound to all but the two index tensors (a
    ``functools.partial`` of the launcher: calling it adds no frame of ours)
    and whether it runs interpreted (then each launch holds
    ``interpreter_launch``'s lock). It must be called with indices of the
    checked ones' length, dtype and device.
    """
    forms = (src_form, dst_form)
    checked = check_rows(
        src, dst, (src_indices, dst_indices), item_size, forms, (layer_offset, num_layers)
    )
    item_w, src_side, dst_side, head_w, layers = checked
    components = len(src)
    if components == 1:
        src, dst = (src[0], src[0]), (dst[0], dst[0])  # the V deltas are then 0, unused
    src_k, src_v = (byte_view(t) for t in src)
    dst_k, dst_v = (byte_view(t) for t in dst)
    kv_mha = _mha_kernels()
    launch = functools.partial(
        kv_mha.launch_copy_kv_rows,
        src_k,
        dst_k,
        words=item_w,
        head_words=head_w,
        layer_offset=layer_offset,
        num_layers=layers,
        # V is reached as K's address plus their distance (both 8-byte aligned).
        src_v_delta=(src_v.data_ptr() - src_k.data_ptr()) // 8,
        dst_v_delta=(dst_v.data_ptr() - dst_k.data_ptr()) // 8,
        src_side=src_side,
        dst_side=dst_side,
        src_table=src_form.kind == "table",
        dst_table=dst_form.kind == "table",
        components=components,
    )
    return launch, bool(kv_mha.INTERPRETED)


def prepare_rows(
    src: Sequence[torch.Tensor],
    dst: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    **form: Any,
) -> Callable[[], None]:
    """Check a launch now (``bind_rows``, same arguments); it runs when the result is called.

    A host pool whose V rows differ in width from its K rows checks one launch
    per component and runs them only once both are checked.
    """
    launch, interpreted = bind_rows(src, dst, src_indices, dst_indices, **form)

    def run() -> None:
        with interpreter_launch(interpreted):
            launch(src_indices, dst_indices)

    return run


def _kv(
    forms: tuple[RowForm, RowForm],
    tensors: tuple[torch.Tensor, ...],
    item_size: int,
    layer_offset: int = 0,
    num_layers: int = 1,
) -> None:
    """K and V in one checked launch (the upstream-named functions below).

    ``tensors`` is their first six arguments: ``src_k, dst_k, src_v, dst_v,
    src_indices, dst_indices``.
    """
    src_k, dst_k, src_v, dst_v, src_indices, dst_indices = tensors
    prepare_rows(
        (src_k, src_v),
        (dst_k, dst_v),
        src_indices,
        dst_indices,
        item_size=item_size,
        src_form=forms[0],
        dst_form=forms[1],
        layer_offset=layer_offset,
        num_layers=num_layers,
    )()


def _mha_kernels() -> ModuleType:
    """The Triton module, imported on first use after the MLA one.

    Both are built under the same ``TRITON_INTERPRET`` choice, and
    ``start_interpreter`` looks at the MLA module to tell whether it is too late.
    """
    kernels()
    return importlib.import_module("sgl_cuda._triton.kv_mha")


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
    _kv(forms, (src_k, dst_k, src_v, dst_v, src_indices, dst_indices), item_size)


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
    kv = src_k, dst_k, src_v, dst_v, src_indices, dst_indices
    _kv(forms, kv, item_size, check_layer_id(layer_id))


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
    kv = src_k, dst_k, src_v, dst_v, src_indices, dst_indices
    _kv(forms, kv, item_size, check_layer_id(layer_id))


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
    kv = src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices
    _kv(forms, kv, item_size, 0, num_layers)


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
    kv = src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices
    _kv(forms, kv, item_size, 0, num_layers)


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
    kv = src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices
    _kv(forms, kv, item_size, 0, num_layers)
