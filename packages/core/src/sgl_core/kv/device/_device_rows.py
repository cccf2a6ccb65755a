"""Per-layer device rows: one tensor per (component, layer) for every kind of KV pool
(the per-layer device pools of docs/design.md sections 5a, 5b).

With ``layers_in_one_allocation`` a component's rows are equally spaced
views of one tensor, which lets the ``direct`` io backend move a run of
pages for every layer in one strided copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from sgl_core.errors import PoolSizeError
from sgl_core.kv._memory import cpu_zeros
from sgl_core.kv._spec import KVSpec
from sgl_core.kv._validation import check_value_rows
from sgl_core.kv.device._slot_geometry import SlotGeometry

__all__ = [
    "PerLayerRows",
    "check_raw_rows",
    "stacked_layers",
]


class PerLayerRows(SlotGeometry):
    """A device pool that keeps every component of ``spec`` as per-row tensors."""

    spec: KVSpec
    layers_in_one_allocation: ClassVar[bool] = True

    def _allocate_rows(self) -> None:
        """``<component>_buffer``: a list of ``(slots, heads, dim)`` tensors per component."""
        slots = self.slot_count
        try:
            for c in self.spec.components:
                shape = (slots, c.heads, c.dim)
                n = c.rows(self.spec.layer_num)
                if self.layers_in_one_allocation:
                    stacked = cpu_zeros((n, *shape), c.dtype, self._device)
                    rows = list(stacked.unbind(0))
                else:
                    rows = [cpu_zeros(shape, c.dtype, self._device) for _ in range(n)]
                setattr(self, c.device_name, rows)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"device pool does not fit on {self._device}: {exc}") from None

    @property
    def device(self) -> torch.device:
        first: list[torch.Tensor] = getattr(self, self.spec.components[0].device_name)
        return first[0].device


def check_raw_rows(rows: object, n: int, dim: int, dtype: torch.dtype) -> None:
    """``rows`` is an ``(n, dim)`` tensor of ``dtype`` with values, else a typed error
    (``ShapeMismatchError`` for shape or dtype, ``DeviceError`` for a meta tensor)."""
    check_value_rows(rows, "rows", (n, dim), dtype)


def stacked_layers(layers: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``(layer_num, *layer.shape)`` view of layers that are equally spaced in one storage.

    None when the layers are separate allocations (or replaced, or strided):
    the caller then copies layer by layer.
    """
    first = layers[0]
    if len(layers) < 2 or not first.is_contiguous():
        return None
    item = first.element_size()
    step = layers[1].data_ptr() - first.data_ptr()
    if step < first.numel() * item or step % item:
        return None
    storage = first.untyped_storage().data_ptr()
    for i, layer in enumerate(layers):
        if (
            layer.data_ptr() != first.data_ptr() + i * step
            or layer.untyped_storage().data_ptr() != storage
            or layer.shape != first.shape
            or layer.dtype != first.dtype
            or not layer.is_contiguous()
        ):
            return None
    return first.as_strided((len(layers), *first.shape), (step // item, *first.stride()))
