"""The checked, bound row launch behind every ``sgl_cuda.kvcacheio`` transfer and the pools.

``bind_rows`` runs every O(1) check (``sgl_cuda._kv_checks``) and binds one launch
of ``sgl_cuda._triton.kvcacheio`` for ``(K,)`` (MLA) or ``(K, V)`` buffers or
pointer tables; the address forms are in ``sgl_cuda.kvcacheio``'s docstring.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from sgl_core.backend import byte_view
from sgl_cuda._kernels import kernels
from sgl_cuda._kv_checks import RowForm, check_rows

__all__ = ["RowForm", "bind_rows"]


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
    labels: Sequence[str] = ("k", "v"),
) -> tuple[Callable[[torch.Tensor, torch.Tensor], None], bool]:
    """Check a launch for ``(K,)`` or ``(K, V)`` buffers (or tables) of one row size now.

    Returns the launch bound to all but the two index tensors (a
    ``functools.partial`` of the launcher: calling it adds no frame of ours)
    and whether it runs interpreted (then each launch holds
    ``interpreter_launch``'s lock). It must be called with indices of the
    checked ones' length, dtype and device.
    """
    forms = (src_form, dst_form)
    indices = (src_indices, dst_indices)
    checked = check_rows(src, dst, indices, item_size, forms, (layer_offset, num_layers), labels)
    item_w, src_side, dst_side, head_w, layers = checked
    components = len(src)
    if components == 1:
        src, dst = (src[0], src[0]), (dst[0], dst[0])  # the V deltas are then 0, unused
    src_k, src_v = (byte_view(t) for t in src)
    dst_k, dst_v = (byte_view(t) for t in dst)
    kv_mha = kernels()
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
