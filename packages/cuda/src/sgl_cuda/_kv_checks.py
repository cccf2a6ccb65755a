"""The O(1) argument checks of every ``sgl_cuda.kvcacheio`` kernel launch, and the launch.

``bind_rows`` runs them before any launch (a rejected call changes nothing) and
binds one launch of ``sgl_cuda._triton.kvcacheio`` for ``(K,)`` (MLA) or ``(K, V)``
buffers or pointer tables (address forms: docs/design.md sections 5 and 6; what is
not checked: ``sgl_cuda.kvcacheio``'s docstring).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch

from sgl_core.backend import byte_view
from sgl_core.errors import (
    BackendUnavailableError,
    IndexDTypeError,
    IndexShapeError,
    LayerIndexError,
    SGLError,
    ShapeMismatchError,
)
from sgl_cuda._kernels import interpreter_active, kernels

__all__ = [
    "RowForm",
    "Side",
    "bind_rows",
    "check_buffer",
    "check_head_num",
    "check_index_pair",
    "check_indices",
    "check_layer_id",
    "check_page_size",
    "check_table",
    "side_words",
    "words",
]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def words(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % 8:
        raise ShapeMismatchError(
            f"{name} must be a positive multiple of 8 bytes (rows move as int64 words), "
            f"got {value!r}"
        )
    return value // 8


def check_index_pair(
    src_indices: torch.Tensor, dst_indices: torch.Tensor, *, contiguous: bool = True
) -> None:
    """Two int64 1-D index tensors (``contiguous``: also dense) of equal length."""
    for name, idx in (("src_indices", src_indices), ("dst_indices", dst_indices)):
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64:
            raise IndexDTypeError(f"{name} must be a torch.int64 tensor")
        if idx.dim() != 1 or (contiguous and not idx.is_contiguous()):
            shape = "a contiguous 1-D tensor" if contiguous else "1-D"
            raise IndexShapeError(f"{name} must be {shape}")
    if src_indices.numel() != dst_indices.numel():
        raise IndexShapeError(
            "src_indices and dst_indices must have equal length, "
            f"got {src_indices.numel()} and {dst_indices.numel()}"
        )


def check_indices(src_indices: torch.Tensor, dst_indices: torch.Tensor) -> torch.device:
    check_index_pair(src_indices, dst_indices)
    if src_indices.device != dst_indices.device:
        raise ShapeMismatchError(
            f"src_indices is on {src_indices.device}, dst_indices on {dst_indices.device}"
        )
    device = src_indices.device
    if device.type == "cuda" or (device.type == "cpu" and interpreter_active()):
        return device
    raise BackendUnavailableError(
        f"the transfer kernels need CUDA tensors (indices are on {device}); "
        "CPU tensors work only with TRITON_INTERPRET=1"
    )


def check_table(table: torch.Tensor, name: str, device: torch.device, layers: int) -> None:
    if not isinstance(table, torch.Tensor) or table.dtype != torch.uint64:
        raise ShapeMismatchError(f"{name} must be a torch.uint64 pointer table")
    if table.device != device:
        raise ShapeMismatchError(f"{name} is on {table.device}; the kernel runs on {device}")
    if table.dim() != 1 or not table.is_contiguous() or table.numel() < layers:
        raise ShapeMismatchError(
            f"{name} must be a contiguous 1-D table of at least {layers} entries, "
            f"got shape {tuple(table.shape)}"
        )


def check_buffer(buf: torch.Tensor, name: str, device: torch.device) -> None:
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


def check_layer_id(layer_id: int, name: str = "layer_id") -> int:
    if not _is_int(layer_id) or layer_id < 0:
        raise LayerIndexError(f"{name} must be a non-negative int, got {layer_id!r}")
    return layer_id


def check_page_size(page_size: int, error: type[SGLError] = ShapeMismatchError) -> int:
    if not _is_int(page_size) or page_size <= 0:
        raise error(f"page_size must be a positive int, got {page_size!r}")
    return page_size


def check_head_num(head_num: int, **dims: int) -> int:
    """``head_num`` splits every byte size in ``dims`` into whole int64 words per head.

    The page-head layout moves each head's slice on its own, as int64 words,
    so a head's share of each size must be a multiple of 8 bytes.
    """
    if not _is_int(head_num) or head_num <= 0:
        raise ShapeMismatchError(f"head_num must be a positive int, got {head_num!r}")
    for name, value in dims.items():
        if value % (8 * head_num):
            raise ShapeMismatchError(
                f"{name} ({value}) must split into {head_num} heads of a multiple of "
                "8 bytes each (heads move as int64 words)"
            )
    return head_num


# A side's geometry in int64 words: (row, layer, page, head strides, page_size, page_head).
Side = tuple[int, int, int, int, int, bool]


@dataclasses.dataclass(frozen=True)
class RowForm:
    """How one side of a transfer addresses its rows (``sgl_cuda.kvcacheio``'s forms).

    ``kind`` is ``layer_first``, ``page_first``, ``page_head`` or ``table``;
    ``layout_dim`` (bytes) is the page-first / page-head token stride, ``page_size``
    and ``head_num`` matter for ``page_head`` only. ``side`` (``"src"`` or
    ``"dst"``) names the arguments in error messages as upstream does.
    """

    kind: str
    side: str
    layout_dim: int = 0
    page_size: int = 1
    head_num: int = 1


def side_words(form: RowForm, item_w: int, item_size: int) -> tuple[Side, int]:
    """A side's geometry and its head width in words (the whole row unless page_head)."""
    if form.kind in ("layer_first", "table"):
        return (item_w, 0, 0, 0, 1, False), item_w
    layout_w = words(form.layout_dim, f"{form.side}_layout_dim")
    if form.kind == "page_first":
        return (layout_w, item_w, 0, 0, 1, False), item_w
    ps = check_page_size(form.page_size)
    heads = check_head_num(
        form.head_num, item_size=item_size, **{f"{form.side}_layout_dim": form.layout_dim}
    )
    head_row_w = layout_w // heads  # one head of one token, all layers
    side = (head_row_w, item_w // heads, ps * layout_w, ps * head_row_w, ps, True)
    return side, item_w // heads


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
    """Check a launch for ``(K,)`` or ``(K, V)`` buffers (or tables) of one row size now:
    every O(1) check (item words, both sides, head words, layers).

    ``labels`` name each component's arguments in errors (``src_k``,
    ``src_k_layers``); an empty label names the side alone (``src``, the MLA
    functions of ``sgl_cuda.kvcacheio``). Returns the launch bound to all but
    the two index tensors (a ``functools.partial`` of the launcher: calling it
    adds no frame of ours) and whether it runs interpreted (then each launch
    holds ``interpreter_launch``'s lock). It must be called with indices of the
    checked ones' length, dtype and device.
    """
    item_w = words(item_size, "item_size")
    src_side, src_head_w = side_words(src_form, item_w, item_size)
    dst_side, dst_head_w = side_words(dst_form, item_w, item_size)
    layers = check_layer_id(num_layers, "num_layers")
    device = check_indices(src_indices, dst_indices)
    if not 1 <= len(src) == len(dst) <= len(labels):
        raise ShapeMismatchError("a transfer moves (K,) or (K, V): one or two of each side")
    for tensors, form in ((src, src_form), (dst, dst_form)):
        for label, t in zip(labels, tensors, strict=False):
            name = f"{form.side}_{label}" if label else form.side
            if form.kind == "table":
                check_table(t, f"{name}_layers", device, layer_offset + layers)
            else:
                check_buffer(t, name, device)
    if src_side[5] and dst_side[5]:
        raise ShapeMismatchError("at most one side of a transfer can be page_head")
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
        head_words=min(src_head_w, dst_head_w),
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
