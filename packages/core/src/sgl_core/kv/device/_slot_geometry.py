"""Token slots of a device pool, whatever its kind (MLA or MHA).

A device pool addresses token slots ``[0, size + page_size)``: ``size`` whole
pages plus the engine's padding page. ``MLAPoolGeometry`` and
``MHAPoolGeometry`` add their kind's row shape on top of this.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sgl_core.errors import PoolSizeError
from sgl_core.kv._spec import positive_int
from sgl_core.kv._validation import (
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
)
from sgl_core.kv.device._devices import check_fits, usable_device
from sgl_core.kv.protocols._kv_protocols import PoolShape

__all__ = ["PoolSizes", "SlotGeometry", "check_pool_geometry"]


def check_pool_geometry(size: int, page_size: int) -> None:
    """Positive ints, ``size`` a whole number of pages."""
    positive_int("size", size)
    positive_int("page_size", page_size)
    if size % page_size:
        raise PoolSizeError(f"size={size} is not a multiple of page_size={page_size}")


class PoolSizes:
    """``size``, ``page_size``, ``layer_num`` and ``dtype`` of a pool (device or host)."""

    shape: PoolShape
    _size: int
    _page_size: int

    @property
    def size(self) -> int:
        return self._size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def layer_num(self) -> int:
        return self.shape.layer_num

    @property
    def dtype(self) -> torch.dtype:
        return self.shape.dtype


class SlotGeometry(PoolSizes):
    """Sizes, slots, dtype and device of a device pool; the row shape is the subclass's.

    A subclass checks ``check_pool_geometry(size, page_size)`` first, sets
    ``shape``, then calls ``_set_slots`` (which refuses a pool that cannot fit).
    """

    def _pool_device(self, device: str | torch.device | None) -> torch.device:
        """The device ``device`` names for this backend's pools (None: its default)."""
        return usable_device(device)

    def _set_slots(self, size: int, page_size: int, device: torch.device) -> None:
        self._size = size
        self._page_size = page_size
        self._device = device
        check_fits(self.slot_count * self.shape.layout_dim, device, "device pool")

    def __repr__(self) -> str:
        return pool_repr(self, {"device": self.device})

    @property
    def page_num(self) -> int:
        """Pages per layer, the padding page included."""
        return (self._size + self._page_size) // self._page_size

    @property
    def slot_count(self) -> int:
        """Addressable token slots, padding page included."""
        return self._size + self._page_size

    @property
    def device(self) -> torch.device:
        return self._device

    def _check_loc(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """``loc`` on the pool's device once ``layer_id`` and ``loc`` check out (slots in range)."""
        check_layer_id(layer_id, self.layer_num)
        check_index_tensor(loc, "loc")
        check_index_device(loc, "loc", self.device)
        check_index_bounds(loc, self.slot_count, "loc")
        return loc.to(self.device)


def pool_repr(pool: Any, extra: dict[str, object]) -> str:
    """``Name(kind=..., [layout=...,] size=..., page_size=..., <row dims>, dtype=..., ...)``.

    The kind and row dims come from the pool's ``shape`` (an ``MLAShape`` or
    ``MHAShape``); ``extra`` adds the device (and a host pool's layout first).
    """
    shape = pool.shape
    kind = type(shape).__name__.removesuffix("Shape").lower()
    fields: dict[str, object] = {"kind": kind}
    if "layout" in extra:
        fields["layout"] = extra["layout"]
    fields.update(size=pool.size, page_size=pool.page_size)
    for f in dataclasses.fields(shape):
        value = getattr(shape, f.name)
        if f.name != "dtype" and value is not None:
            fields["kv_cache_dim" if f.name == "row_dim" else f.name] = value
    fields["dtype"] = shape.dtype
    fields.update((k, v) for k, v in extra.items() if k != "layout")
    body = ", ".join(f"{k}={v}" for k, v in fields.items())
    return f"{type(pool).__name__}({body})"
