"""Per-layer MHA/GQA device pool: the layout of the torch backend (and, subclassed, cuda).

``k_buffer[layer]`` is ``(size + page_size, head_num, head_dim)`` and
``v_buffer[layer]`` ``(size + page_size, head_num, v_head_dim)``, the field
names of SGLang's ``MHATokenToKVPool``. Slot 0 (the first page) is the
engine's padding page, valid to address but never handed out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from sgl_core._copy import byte_view
from sgl_core._devices import usable_device
from sgl_core._kv_protocols import MHADevicePool
from sgl_core._mha_shapes import MHAShape
from sgl_core._slot_geometry import SlotGeometry, check_pool_geometry
from sgl_core._validation import (
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
    check_value_rows,
)
from sgl_core.errors import PoolMismatchError, PoolSizeError

__all__ = ["MHAPoolGeometry", "PerLayerMHADevicePool", "mha_device_layers"]


class MHAPoolGeometry(SlotGeometry):
    """Geometry every MHA device pool reports (the ``MHADevicePool`` properties).

    Backend authors subclass it, call ``__init__`` first, then allocate their
    buffers; override ``device`` to report the buffers' own device.
    """

    shape: MHAShape

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device,
        v_head_dim: int | None = None,
    ) -> None:
        check_pool_geometry(size, page_size)
        v_dim = head_dim if v_head_dim is None else v_head_dim
        self.shape = MHAShape(layer_num, head_num, head_dim, v_dim, dtype)
        self._set_slots(size, page_size, device)

    @property
    def head_num(self) -> int:
        return self.shape.head_num

    @property
    def head_dim(self) -> int:
        return self.shape.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.shape.v_head_dim


class PerLayerMHADevicePool(MHAPoolGeometry):
    """``k_buffer[layer]`` / ``v_buffer[layer]``: one K and one V tensor per layer.

    With ``layers_in_one_allocation`` the K layers are equally spaced views of
    one tensor (and the V layers of another), which lets the ``direct`` io
    backend move a run for every layer in one strided copy; subclasses that
    want one allocation per layer set it to False.
    """

    layers_in_one_allocation: ClassVar[bool] = True

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        v_head_dim: int | None = None,
    ) -> None:
        super().__init__(
            size=size,
            page_size=page_size,
            dtype=dtype,
            head_num=head_num,
            head_dim=head_dim,
            layer_num=layer_num,
            device=usable_device(device),
            v_head_dim=v_head_dim,
        )
        slots = size + page_size
        try:
            self.k_buffer: list[torch.Tensor] = self._layers((slots, head_num, self.head_dim))
            self.v_buffer: list[torch.Tensor] = self._layers((slots, head_num, self.v_head_dim))
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"device pool does not fit on {self._device}: {exc}") from None

    def _layers(self, shape: tuple[int, int, int]) -> list[torch.Tensor]:
        if self.layers_in_one_allocation:
            stacked = torch.zeros((self.layer_num, *shape), dtype=self.dtype, device=self._device)
            return list(stacked.unbind(0))
        return [
            torch.zeros(shape, dtype=self.dtype, device=self._device) for _ in range(self.layer_num)
        ]

    @property
    def device(self) -> torch.device:
        return self.k_buffer[0].device

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[check_layer_id(layer_id, self.layer_num)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[check_layer_id(layer_id, self.layer_num)]

    def _check_loc(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        layer_id = check_layer_id(layer_id, self.layer_num)
        check_index_tensor(loc, "loc")
        check_index_device(loc, "loc", self.device)
        check_index_bounds(loc, self.slot_count, "loc")
        return loc.to(self.device)

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None:
        loc = self._check_loc(layer_id, loc)
        n = loc.numel()
        for name, tensor, dim in (
            ("cache_k", cache_k, self.head_dim),
            ("cache_v", cache_v, self.v_head_dim),
        ):
            check_value_rows(tensor, name, (n, self.head_num, dim), self.dtype)
        # fp8 caches move as bytes (no fp8 index kernels).
        for layers, tensor in ((self.k_buffer, cache_k), (self.v_buffer, cache_v)):
            rows = byte_view(tensor.to(self.device).contiguous())
            byte_view(layers[layer_id]).index_copy_(0, loc, rows)

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self._check_loc(layer_id, loc)
        k = byte_view(self.k_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        v = byte_view(self.v_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        return k, v


def mha_device_layers(device_pool: MHADevicePool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The per-layer ``k_buffer`` and ``v_buffer`` lists of a pool, or ``PoolMismatchError``."""
    k = getattr(device_pool, "k_buffer", None)
    v = getattr(device_pool, "v_buffer", None)
    n = device_pool.layer_num
    if not (isinstance(k, list) and isinstance(v, list) and len(k) == n and len(v) == n):
        raise PoolMismatchError(
            f"{type(device_pool).__name__} has no per-layer k_buffer/v_buffer lists; "
            "this host pool needs a per-layer MHA device pool (torch or cuda backend)"
        )
    return k, v


if TYPE_CHECKING:
    _pool: MHADevicePool = PerLayerMHADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
    )
