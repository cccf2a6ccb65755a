"""KV cache transfers with the upstream engine's names and argument order.

Drop-in for the engine's ``kvcacheio`` transfer module (MLA, MHA and direct
forms; the MHA K/V functions live in ``sgl_cuda._kvcacheio_mha``)::

    from sgl_cuda.kvcacheio import transfer_kv_all_layer_mla, transfer_kv_all_layer, ...

Address forms (docs/design.md section 5), all in bytes, ``item = item_size``:

* layer-first tensor: ``base + idx * item`` (one layer's rows)
* page-first tensor:  ``base + idx * layout_dim + layer * item``
* pointer table:      ``tbl[layer] + idx * item`` (``tbl`` a ``torch.uint64`` tensor)
* page-head tensor (MHA ``*_ph``): per head, see ``sgl_cuda._kvcacheio_mha``

The ``*_mla`` and MHA kernel functions are one Triton launch each: many rows per program,
each row moved as ``item_size // 8`` int64 words, so ``item_size`` (and any
``*_layout_dim``) must be a multiple of 8. They work for any pairing of int64
indices. The ``*_direct`` functions merge index pairs into runs where both
sides step by +1 and copy each run with one slice copy (``sgl_cuda._direct``,
re-exported here).

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

import torch

from sgl_core.backend import byte_view, publish_names
from sgl_cuda._direct import (
    transfer_kv_all_layer_direct_lf_pf,
    transfer_kv_direct,
    transfer_kv_per_layer_direct_pf_lf,
)
from sgl_cuda._kernels import interpreter_active, kernels, start_interpreter
from sgl_cuda._kv_checks import RowForm
from sgl_cuda._kv_checks import check_layer_id as _check_layer_id
from sgl_cuda._kv_checks import check_rows as _check_rows
from sgl_cuda._kvcacheio_mha import (
    transfer_kv_all_layer,
    transfer_kv_all_layer_lf_pf,
    transfer_kv_all_layer_lf_ph,
    transfer_kv_per_layer,
    transfer_kv_per_layer_pf_lf,
    transfer_kv_per_layer_ph_lf,
)
from sgl_cuda._launch_lock import interpreter_launch

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


# ------------------------------------------------------------------ kernels
def _mla(
    src: torch.Tensor,
    dst: torch.Tensor,
    indices: tuple[torch.Tensor, torch.Tensor],
    item_size: int,
    forms: tuple[RowForm, RowForm],
    layer_offset: int = 0,
    num_layers: int = 1,
) -> None:
    """One checked launch; rows move as int64 words, so fp8 buffers go in as bytes.

    Interpreted launches hold one process-wide lock (``_launch_lock``).
    """
    span = (layer_offset, num_layers)
    words, src_side, dst_side, _, layers = _check_rows(
        (src,), (dst,), indices, item_size, forms, span, labels=("",)
    )
    module = kernels()
    with interpreter_launch(bool(module.INTERPRETED)):
        module.launch_copy_rows(
            byte_view(src),
            byte_view(dst),
            *indices,
            words=words,
            layer_offset=layer_offset,
            num_layers=layers,
            src_row_w=src_side[0],
            src_layer_w=src_side[1],
            dst_row_w=dst_side[0],
            dst_layer_w=dst_side[1],
            src_table=forms[0].kind == "table",
            dst_table=forms[1].kind == "table",
        )


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
    forms = RowForm("layer_first", "src"), RowForm("layer_first", "dst")
    _mla(src, dst, (src_indices, dst_indices), item_size, forms)


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
    layer = _check_layer_id(layer_id)
    forms = RowForm("page_first", "src", src_layout_dim), RowForm("layer_first", "dst")
    _mla(src, dst, (src_indices, dst_indices), item_size, forms, layer)


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
    forms = RowForm("table", "src"), RowForm("table", "dst")
    _mla(src_layers, dst_layers, (src_indices, dst_indices), item_size, forms, 0, num_layers)


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
    forms = RowForm("table", "src"), RowForm("page_first", "dst", dst_layout_dim)
    _mla(src_layers, dst, (src_indices, dst_indices), item_size, forms, 0, num_layers)


publish_names(__name__, globals())  # the kernels' entry points report sgl_cuda.kvcacheio
