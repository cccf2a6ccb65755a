"""When a per-layer load may skip re-validation: the memo of the last checked load.

Policy (``MLAHostPoolBase.load_to_device_per_layer``): an engine loads one
batch layer by layer, passing the *same* index tensors for every layer. The
first call of a batch validates everything (index dtype, bounds, duplicates,
page alignment, the device pool). A later call skips that only when all of
these hold, and otherwise validates again:

* the same device pool object and io backend;
* the same index tensor *objects*, with unchanged ``_version`` (bumped by every
  in-place torch write, ``set_`` included), address, shape, strides and dtype;
  a new tensor with equal values is validated again. Inference tensors
  (made under ``torch.inference_mode``) have no version counter: on the CPU
  their values are compared as below; on an accelerator nothing can prove
  them unchanged without a read-back, so every layer's load validates them
  in full (build index tensors outside ``inference_mode`` to keep the memo);
* for index tensors in CPU memory, also equal values (a ``memcmp``, no device
  synchronization), which catches writes torch does not see (numpy, ctypes);
  index tensors on an accelerator are never read back here, so the memo costs
  no host-device synchronization (the first call of a batch does, once);
* the storage of every device tensor the layer's copy touches is unchanged:
  address, shape, strides, dtype, device and storage size
  (:func:`tensor_signature`), so a layer replaced or resized in place
  (``Tensor.set_``, ``untyped_storage().resize_``) is validated again before
  a single byte moves.
"""

from __future__ import annotations

from typing import Any

import torch

from sgl_core.kv._enums import IOBackend
from sgl_core.transfer._transfer import Transfer

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
        self.values = t.clone() if reads_contents(t.device) else None

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
        return self.values is None or bool(torch.equal(t, self.values))


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
