"""Token slots of a device pool, whatever its kind (MLA or MHA; docs/design.md section 5a).

``device`` arguments are parsed and probed (and the pool's bytes checked to
fit) before any allocation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from sgl_core.errors import BackendUnavailableError, DeviceError, PoolSizeError
from sgl_core.kv._memory import available_host_bytes
from sgl_core.kv._spec import positive_int
from sgl_core.kv._validation import (
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
)
from sgl_core.kv.protocols._kv_protocols import PoolShape

__all__ = ["PoolSizes", "SlotGeometry", "check_pool_geometry", "parse_device", "usable_device"]


def parse_device(device: object, *, argument: str = "device") -> torch.device | None:
    """``None``, or a ``str``/``torch.device`` naming a device with storage; else ``DeviceError``.

    Ints are rejected rather than read as a CUDA ordinal: write ``"cuda:0"``.
    """
    if device is None:
        return None
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise DeviceError(
                f"{argument}={device!r} is not a torch device string: {exc}"
            ) from None
    else:
        raise DeviceError(
            f"{argument} must be a str, torch.device or None, got {type(device).__name__} "
            f"{device!r} (write e.g. 'cuda:0')"
        )
    if parsed.type == "meta":
        raise DeviceError(
            f"{argument}={str(parsed)!r}: meta tensors have no storage for a KV cache"
        )
    return parsed


def usable_device(device: object, *, argument: str = "device") -> torch.device:
    """A parsed device (``None``: cpu) on which torch can allocate here."""
    parsed = parse_device(device, argument=argument) or torch.device("cpu")
    if parsed.type == "cpu":
        return parsed
    try:
        torch.empty(0, device=parsed)
    except (RuntimeError, AssertionError, ValueError) as exc:
        raise BackendUnavailableError(
            f"{argument}={str(parsed)!r} is not usable here: {exc}"
        ) from None
    return parsed


def check_fits(nbytes: int, device: torch.device, what: str) -> None:
    """``PoolSizeError`` when ``nbytes`` exceed the free memory of ``device`` (where known).

    Checked before allocating: a CPU allocation beyond memory can succeed and
    then get the process killed when its pages are zeroed.
    """
    free: int | None = None
    if device.type == "cpu":
        free = available_host_bytes()
    elif device.type == "cuda" and torch.cuda.is_available():
        free = int(torch.cuda.mem_get_info(device)[0])
    if free is not None and nbytes > free:
        raise PoolSizeError(
            f"{what} needs {nbytes / 1e9:.2f} GB but only {free / 1e9:.2f} GB of {device} "
            "memory is free"
        )


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
