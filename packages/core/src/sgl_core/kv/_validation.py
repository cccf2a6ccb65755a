"""Argument checks shared by every backend; all run before any byte moves."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sgl_core.errors import (
    ArgumentTypeError,
    DeviceError,
    DuplicateIndexError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    LayerIndexError,
    PageAlignmentError,
    PoolMismatchError,
    ShapeMismatchError,
)
from sgl_core.transfer.copy._pieces import distinct_count, index_array

__all__ = [
    "as_index_tensor",
    "check_backed",
    "check_index_bounds",
    "check_index_device",
    "check_index_pair",
    "check_index_tensor",
    "check_layer_id",
    "check_page_runs",
    "check_unique",
    "check_value_rows",
    "check_value_tensor",
    "differing_fields",
    "index_values",
]


def check_index_tensor(indices: object, argument: str) -> torch.Tensor:
    """A 1-D ``torch.int64`` tensor, or an error naming ``argument``."""
    if not isinstance(indices, torch.Tensor):
        raise IndexDTypeError(f"{argument} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype != torch.int64:
        raise IndexDTypeError(f"{argument} must have dtype torch.int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise IndexShapeError(f"{argument} must be 1-D, got shape {tuple(indices.shape)}")
    if indices.device.type == "meta":
        raise DeviceError(f"{argument} is a meta tensor: it has no values to index with")
    return indices


def as_index_tensor(indices: object, argument: str) -> torch.Tensor:
    """``indices`` as a 1-D ``torch.int64`` tensor: a tensor is checked as it is,
    a sequence (or numpy array) must hold ints; nothing is rounded.

    Floats, bools, str and other objects raise ``IndexDTypeError``; a value
    outside int64 raises ``IndexOutOfRangeError``.
    """
    if isinstance(indices, torch.Tensor):
        return check_index_tensor(indices, argument)
    if isinstance(indices, (str, bytes, bytearray)) or not isinstance(
        indices, (Sequence, np.ndarray)
    ):
        raise IndexDTypeError(
            f"{argument} must be a torch.int64 tensor or a sequence of ints, "
            f"got {type(indices).__name__}"
        )
    values = list(indices)
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise IndexDTypeError(f"{argument} must hold ints, got {v!r}")
    try:
        return torch.tensor([int(v) for v in values], dtype=torch.int64)
    except (OverflowError, RuntimeError, ValueError) as exc:
        raise IndexOutOfRangeError(f"{argument} holds a value outside int64: {exc}") from None


def check_index_device(indices: torch.Tensor, argument: str, device: torch.device) -> None:
    """Indices in CPU memory or on the pool's own ``device``."""
    if indices.device.type != "cpu" and indices.device != device:
        raise DeviceError(
            f"{argument} is on {indices.device}; indices must be on the cpu or on {device}"
        )


def check_index_pair(
    first: object, first_name: str, second: object, second_name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two valid index tensors of equal length."""
    a = check_index_tensor(first, first_name)
    b = check_index_tensor(second, second_name)
    if a.numel() != b.numel():
        raise IndexShapeError(
            f"{first_name} and {second_name} must have equal length, "
            f"got {a.numel()} and {b.numel()}"
        )
    return a, b


def index_values(indices: torch.Tensor) -> Any:
    """CPU indices as a numpy view (``index_array``: no ATen op, so no OpenMP team that
    could wait for a busy core), an accelerator's as they are: the checks below use
    only what both offer (``min``, ``max``, ``reshape``, slicing, arithmetic, ``all``)."""
    return index_array(indices) if indices.device.type == "cpu" else indices


def check_index_bounds(indices: torch.Tensor, limit: int, argument: str) -> None:
    """Every index in ``[0, limit)``."""
    if indices.numel() == 0:
        return
    values = index_values(indices)
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise IndexOutOfRangeError(f"{argument} holds {bad}, outside the valid range [0, {limit})")


def check_unique(indices: torch.Tensor, argument: str, limit: int | None = None) -> None:
    """No index appears twice (a destination written twice loses data).

    CPU indices are counted with numpy (``distinct_count``), which starts no
    OpenMP team: ATen's ``index_put_`` starts one even for a few thousand
    indices, and beside a busy process it waits for the busy core (BENCHMARKS.md,
    "Validation without an OpenMP team").
    An accelerator's indices are counted where they are (``torch.unique``).
    """
    n = indices.numel()
    if n < 2:
        return
    if indices.device.type == "cpu":
        distinct = distinct_count(index_array(indices), limit)
    else:
        distinct = int(torch.unique(indices).numel())
    if distinct != n:
        raise DuplicateIndexError(f"{argument} contains duplicate indices")


def check_page_runs(indices: torch.Tensor, page_size: int, argument: str) -> None:
    """Whole pages: runs of ``page_size`` consecutive tokens starting on a page boundary."""
    n = indices.numel()
    if n % page_size:
        raise PageAlignmentError(
            f"{argument} has {n} indices, not a whole number of pages of {page_size}"
        )
    if n == 0 or page_size == 1:
        return
    pages = index_values(indices).reshape(-1, page_size)
    starts, steps = pages[:, 0] % page_size == 0, pages[:, 1:] - pages[:, :-1] == 1
    aligned = bool(starts.all()) and bool(steps.all())
    if not aligned:
        raise PageAlignmentError(
            f"{argument} must be whole pages: runs p*{page_size} .. p*{page_size}+{page_size - 1}"
        )


def check_layer_id(layer_id: object, layer_num: int) -> int:
    """Any integer (``operator.index``: int, numpy integer, 0-d integer tensor;
    not ``bool``) in ``[0, layer_num)``, returned as a plain int."""
    if isinstance(layer_id, (bool, np.bool_)) or (
        isinstance(layer_id, torch.Tensor) and layer_id.dtype == torch.bool
    ):
        raise ArgumentTypeError(f"layer_id must be an int, got {type(layer_id).__name__}")
    try:
        value = operator.index(layer_id)  # type: ignore[arg-type]
    except (TypeError, RuntimeError):
        raise ArgumentTypeError(f"layer_id must be an int, got {type(layer_id).__name__}") from None
    if not 0 <= value < layer_num:
        raise LayerIndexError(f"layer_id={value} is outside [0, {layer_num})")
    return value


def check_value_tensor(t: object, name: str) -> torch.Tensor:
    """A tensor with values to write: ``ArgumentTypeError`` for a non-tensor,
    ``DeviceError`` for a meta tensor (as for meta indices)."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type == "meta":
        raise DeviceError(f"{name} is a meta tensor: it has no values to write")
    return t


def check_value_rows(
    t: object, name: str, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """Rows to write of exactly ``shape`` and the pool's ``dtype`` (no conversion):
    ``ShapeMismatchError`` (a ``PoolMismatchError``) otherwise."""
    rows = check_value_tensor(t, name)
    if tuple(rows.shape) != shape or rows.dtype != dtype:
        raise ShapeMismatchError(
            f"{name} must be a {shape} {dtype} tensor (values are not converted), "
            f"got {tuple(rows.shape)} {rows.dtype}"
        )
    return rows


def check_backed(t: torch.Tensor, name: str) -> None:
    """``PoolMismatchError`` unless every element of ``t`` lies inside its storage.

    A storage resized in place (``untyped_storage().resize_``) leaves the
    tensor's shape claiming bytes that are no longer there.
    """
    if t.device.type == "meta":
        raise PoolMismatchError(f"{name} is a meta tensor (no storage)")
    if t.numel() == 0:
        return
    extent = t.storage_offset() + sum(
        (n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)
    )
    if (extent + 1) * t.element_size() > t.untyped_storage().nbytes():
        raise PoolMismatchError(f"{name} reaches past the end of its storage")


def differing_fields(names: Sequence[str], theirs: Sequence[object], mine: Sequence[object]) -> str:
    """``"dtype is torch.float32, expected torch.bfloat16; ..."`` for each field that differs."""
    return "; ".join(
        f"{name} is {a}, expected {b}"
        for name, a, b in zip(names, theirs, mine, strict=True)
        if a != b
    )
