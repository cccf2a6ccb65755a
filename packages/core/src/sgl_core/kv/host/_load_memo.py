"""When a per-layer load may skip re-validation: the memo of the last checked load.

The policy (same pool, io backend and index tensor objects, unchanged
versions and storage; CPU index values compared by value (numpy); no device
read-back) is docs/design.md section 7, "Per-layer loads validate once per
batch"; :class:`CheckedLoad` holds what the first load of a batch checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sgl_core.kv._enums import IOBackend
from sgl_core.transfer._transfer import Transfer
from sgl_core.transfer.copy._pieces import index_array

__all__ = ["CheckedLoad", "IndexStamp", "reads_contents", "tensor_signature"]


def reads_contents(device: torch.device) -> bool:
    """Whether the memo compares index *values* on ``device`` (CPU only: no sync)."""
    return device.type == "cpu"


def tensor_signature(t: torch.Tensor) -> tuple[object, ...]:
    """What a copy into ``t`` relies on: where its bytes are and how many there are."""
    storage = t.untyped_storage()
    return (
        t.data_ptr(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
        storage.data_ptr(),
        storage.nbytes(),
    )


class IndexStamp:
    """One validated index tensor: held (so its id cannot be recycled) and stamped."""

    __slots__ = ("dtype", "ptr", "shape", "stride", "tensor", "values", "version")

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t
        # Inference tensors track no version (reading ``_version`` raises).
        self.version: int | None = None if t.is_inference() else t._version
        self.ptr = t.data_ptr()
        self.shape = tuple(t.shape)
        self.stride = t.stride()
        self.dtype = t.dtype
        # numpy: a copy and a compare start no OpenMP team (a large batch's torch.equal
        # did, per layer; BENCHMARKS.md, "Validation without an OpenMP team")
        self.values = index_array(t).copy() if reads_contents(t.device) else None

    def matches(self, given: object) -> bool:
        if given is not self.tensor:
            return False
        t = self.tensor
        if self.version is None and self.values is None:
            return False  # no version counter and no value check: cannot tell
        if (
            (self.version is not None and t._version != self.version)
            or t.data_ptr() != self.ptr
            or tuple(t.shape) != self.shape
            or t.stride() != self.stride
            or t.dtype != self.dtype
        ):
            return False
        return self.values is None or bool(np.array_equal(index_array(t), self.values))


class CheckedLoad:
    """The arguments of the last per-layer load that passed validation."""

    __slots__ = (
        "device_indices",
        "fingerprint",
        "host_indices",
        "io_backend",
        "storage",
        "transfer",
    )

    def __init__(
        self,
        fingerprint: tuple[object, ...],
        io_backend: IOBackend | str,
        transfer: Transfer[Any],
        storage: list[tuple[object, ...]],
    ) -> None:
        self.fingerprint = fingerprint
        self.host_indices = IndexStamp(transfer.host_indices)
        self.device_indices = IndexStamp(transfer.device_indices)
        self.io_backend = io_backend
        #: The validated transfer, handed again to the mover for the next layers' loads.
        self.transfer = transfer
        #: Per layer: the signatures of the device tensors its load touches.
        self.storage = storage

    def matches(
        self,
        fingerprint: tuple[object, ...],
        host_indices: object,
        device_indices: object,
        io_backend: IOBackend | str,
    ) -> bool:
        return (
            len(fingerprint) == len(self.fingerprint)
            and all(a is b for a, b in zip(fingerprint, self.fingerprint, strict=True))
            and io_backend == self.io_backend
            and self.host_indices.matches(host_indices)
            and self.device_indices.matches(device_indices)
        )
