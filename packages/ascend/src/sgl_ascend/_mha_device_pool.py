"""Contiguous multi-layer MHA / GQA device pool of the Ascend backend (docs/design.md).

The layout is the one the Ascend serving engine allocates for MHA models
(its NPU MHA token-to-KV pool keeps exactly these two tensors for its host
cache transfers)::

    k_buffer (layer_num, page_num, page_size, head_num, head_dim)
    v_buffer (layer_num, page_num, page_size, head_num, v_head_dim)

``page_num = size // page_size + 1``: token slots ``[0, size + page_size)``
are valid (page 0, slots ``[0, page_size)``, is the engine's padding page)
and token ``t`` lives at page
``t // page_size``, offset ``t % page_size``. One token of one layer is a
``(head_num, head_dim)`` K row and a ``(head_num, v_head_dim)`` V row. For GQA
``head_num`` is the number of KV heads. There is no ``data_ptrs`` table and no
per-layer list: code that needs one of those must not receive this pool.
"""

from __future__ import annotations

import torch

from sgl_ascend import _npu
from sgl_core.backend import (
    MHAPoolGeometry,
    byte_view,
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
    check_value_rows,
)
from sgl_core.errors import PoolSizeError

__all__ = ["AscendMHADevicePool"]


class AscendMHADevicePool(MHAPoolGeometry):
    """Layer-major contiguous MHA / GQA KV cache: one K and one V 5-D tensor."""

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
            device=_npu.resolve_device(device),
            v_head_dim=v_head_dim,
        )
        pages = (layer_num, self.page_num, page_size, head_num)
        self.k_buffer = self._zeros((*pages, head_dim))
        self.v_buffer = self._zeros((*pages, self.v_head_dim))

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        try:
            return torch.zeros(shape, dtype=self.dtype, device=self._device)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"device pool does not fit on {self._device}: {exc}") from None

    @property
    def device(self) -> torch.device:
        return self.k_buffer.device

    @property
    def components(self) -> list[torch.Tensor]:
        """k, v: the buffers a host page mirrors, in flat-page order."""
        return [self.k_buffer, self.v_buffer]

    @property
    def kv_components(self) -> int:
        """How many leading components hold KV rows (all of them: K and V)."""
        return 2

    def indexer_slot(self, layer_id: int) -> int | None:
        """Always None: an MHA pool has no indexer cache (the kv-split mover asks)."""
        layer_id = check_layer_id(layer_id, self.layer_num)
        return None

    # ------------------------------------------------------------ token rows
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, head_num, head_dim)`` view of one layer's K cache."""
        return self.k_buffer[check_layer_id(layer_id, self.layer_num)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, head_num, v_head_dim)`` view of one layer's V cache."""
        return self.v_buffer[check_layer_id(layer_id, self.layer_num)]

    def _rows(self, buffer: torch.Tensor, layer_id: int) -> torch.Tensor:
        """``(slot_count, head_num, dim)`` view of one layer (fp8 as bytes)."""
        return byte_view(buffer[layer_id].view(self.slot_count, self.head_num, buffer.shape[-1]))

    def _check_loc(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        layer_id = check_layer_id(layer_id, self.layer_num)
        check_index_tensor(loc, "loc")
        check_index_device(loc, "loc", self.device)
        check_index_bounds(loc, self.slot_count, "loc")
        return loc.to(self.device)

    def _check_rows(self, name: str, tensor: object, n: int, dim: int) -> torch.Tensor:
        """``(n, head_num, dim)`` rows of the pool's dtype with values, as bytes on the device.

        Another dtype, shape or a meta tensor is a typed error (``check_value_rows``):
        values are never converted; fp8 caches move as bytes (no fp8 index kernels).
        """
        rows = check_value_rows(tensor, name, (n, self.head_num, dim), self.dtype)
        return byte_view(rows.to(self.device).contiguous())

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Write ``(n, head_num, head_dim)`` K and ``(n, head_num, v_head_dim)`` V rows at ``loc``.

        Every argument is checked before either buffer changes.
        """
        loc = self._check_loc(layer_id, loc)
        n = loc.numel()
        k_rows = self._check_rows("cache_k", cache_k, n, self.head_dim)
        v_rows = self._check_rows("cache_v", cache_v, n, self.v_head_dim)
        self._rows(self.k_buffer, layer_id).index_copy_(0, loc, k_rows)
        self._rows(self.v_buffer, layer_id).index_copy_(0, loc, v_rows)

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the ``(k, v)`` rows at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        return (
            self._rows(self.k_buffer, layer_id).index_select(0, loc).view(self.dtype),
            self._rows(self.v_buffer, layer_id).index_select(0, loc).view(self.dtype),
        )
