"""Contiguous multi-layer MHA / GQA device pool of the Ascend backend (docs/design.md).

The layout is the one the Ascend serving engine allocates for MHA models
(its NPU MHA token-to-KV pool keeps exactly these two tensors for its host
cache transfers)::

    k_buffer (layer_num, page_num, page_size, head_num, head_dim)
    v_buffer (layer_num, page_num, page_size, head_num, v_head_dim)

``page_num = size // page_size + 1``: token slots ``[0, size + page_size)``
are valid (slot 0 is the engine's padding slot) and token ``t`` lives at page
``t // page_size``, offset ``t % page_size``. One token of one layer is a
``(head_num, head_dim)`` K row and a ``(head_num, v_head_dim)`` V row. For GQA
``head_num`` is the number of KV heads. There is no ``data_ptrs`` table and no
per-layer list: code that needs one of those must not receive this pool.
"""

from __future__ import annotations

import torch

from sgl_ascend import _npu
from sgl_core.backend import (
    byte_view,
    check_fits,
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
)
from sgl_core.errors import ArgumentTypeError, PoolMismatchError, PoolSizeError

__all__ = ["AscendMHADevicePool"]


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PoolSizeError(f"{name} must be a positive int, got {value!r}")
    return value


class AscendMHADevicePool:
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
        self._size = _positive("size", size)
        self._page_size = _positive("page_size", page_size)
        if size % page_size:
            raise PoolSizeError(f"size={size} is not a multiple of page_size={page_size}")
        self._head_num = _positive("head_num", head_num)
        self._head_dim = _positive("head_dim", head_dim)
        self._layer_num = _positive("layer_num", layer_num)
        self._v_head_dim = head_dim if v_head_dim is None else _positive("v_head_dim", v_head_dim)
        if not isinstance(dtype, torch.dtype):
            raise ArgumentTypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        self._dtype = dtype
        resolved = _npu.resolve_device(device)
        check_fits(self.slot_count * self.bytes_per_token, resolved, "device pool")
        pages = (layer_num, self.page_num, page_size, head_num)
        self.k_buffer = self._zeros((*pages, head_dim), resolved)
        self.v_buffer = self._zeros((*pages, self._v_head_dim), resolved)

    def _zeros(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        try:
            return torch.zeros(shape, dtype=self._dtype, device=device)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"device pool does not fit on {device}: {exc}") from None

    # ------------------------------------------------------------ geometry
    @property
    def size(self) -> int:
        return self._size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def page_num(self) -> int:
        """Pages per layer, the padding page included."""
        return self._size // self._page_size + 1

    @property
    def slot_count(self) -> int:
        """Addressable token slots, padding page included."""
        return self._size + self._page_size

    @property
    def layer_num(self) -> int:
        return self._layer_num

    @property
    def head_num(self) -> int:
        return self._head_num

    @property
    def head_dim(self) -> int:
        return self._head_dim

    @property
    def v_head_dim(self) -> int:
        return self._v_head_dim

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self.k_buffer.device

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self._dtype).element_size()

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token's K and V rows over every layer."""
        per_layer = self._head_num * (self._head_dim + self._v_head_dim) * self.itemsize
        return per_layer * self._layer_num

    @property
    def components(self) -> list[torch.Tensor]:
        """k, v: the buffers a host page mirrors, in flat-page order."""
        return [self.k_buffer, self.v_buffer]

    def indexer_slot(self, layer_id: int) -> int | None:
        """Always None: an MHA pool has no indexer cache (the kv-split mover asks)."""
        check_layer_id(layer_id, self._layer_num)
        return None

    # ------------------------------------------------------------ token rows
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, head_num, head_dim)`` view of one layer's K cache."""
        return self.k_buffer[check_layer_id(layer_id, self._layer_num)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, head_num, v_head_dim)`` view of one layer's V cache."""
        return self.v_buffer[check_layer_id(layer_id, self._layer_num)]

    def _rows(self, buffer: torch.Tensor, layer_id: int) -> torch.Tensor:
        """``(slot_count, head_num, dim)`` view of one layer (fp8 as bytes)."""
        return byte_view(buffer[layer_id].view(self.slot_count, self._head_num, buffer.shape[-1]))

    def _check_loc(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        check_layer_id(layer_id, self._layer_num)
        check_index_tensor(loc, "loc")
        check_index_device(loc, "loc", self.device)
        check_index_bounds(loc, self.slot_count, "loc")
        return loc.to(self.device)

    def _check_rows(self, name: str, tensor: object, n: int, dim: int) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        expected = (n, self._head_num, dim)
        if tuple(tensor.shape) != expected:
            raise PoolMismatchError(f"{name} must have shape {expected}, got {tuple(tensor.shape)}")
        # fp8 caches move as bytes (no fp8 index kernels); values convert first.
        return byte_view(tensor.to(self.device, self._dtype))

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        """Write ``(n, head_num, head_dim)`` K and ``(n, head_num, v_head_dim)`` V rows at ``loc``.

        Every argument is checked before either buffer changes.
        """
        loc = self._check_loc(layer_id, loc)
        n = loc.numel()
        k_rows = self._check_rows("cache_k", cache_k, n, self._head_dim)
        v_rows = self._check_rows("cache_v", cache_v, n, self._v_head_dim)
        self._rows(self.k_buffer, layer_id).index_copy_(0, loc, k_rows)
        self._rows(self.v_buffer, layer_id).index_copy_(0, loc, v_rows)

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the ``(k, v)`` rows at token ``loc``."""
        loc = self._check_loc(layer_id, loc)
        return (
            self._rows(self.k_buffer, layer_id).index_select(0, loc).view(self._dtype),
            self._rows(self.v_buffer, layer_id).index_select(0, loc).view(self._dtype),
        )
