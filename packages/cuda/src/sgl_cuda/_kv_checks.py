"""The O(1) argument checks shared by every ``sgl_cuda.kvcacheio`` kernel launch.

They run before any launch, so a rejected call changes nothing. What they do
not check (bounds, duplicates, the addresses inside pointer tables) is listed
in ``sgl_cuda.kvcacheio``'s docstring.
"""

from __future__ import annotations

import torch

from sgl_core.errors import (
    BackendUnavailableError,
    IndexDTypeError,
    IndexShapeError,
    LayerIndexError,
    ShapeMismatchError,
)
from sgl_cuda._kernels import interpreter_active

__all__ = [
    "check_buffer",
    "check_head_num",
    "check_indices",
    "check_layer_id",
    "check_layers",
    "check_page_size",
    "check_table",
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


def check_indices(src_indices: torch.Tensor, dst_indices: torch.Tensor) -> torch.device:
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


def check_layers(num_layers: int) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
        raise LayerIndexError(f"num_layers must be a non-negative int, got {num_layers!r}")
    return num_layers


def check_layer_id(layer_id: int) -> int:
    if not _is_int(layer_id) or layer_id < 0:
        raise LayerIndexError(f"layer_id must be a non-negative int, got {layer_id!r}")
    return layer_id


def check_page_size(page_size: int) -> int:
    if not _is_int(page_size) or page_size <= 0:
        raise ShapeMismatchError(f"page_size must be a positive int, got {page_size!r}")
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
