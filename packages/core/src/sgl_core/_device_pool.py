"""Per-layer MLA device pool: the layout of the torch and CUDA backends."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

import torch

from sgl_core._copy import byte_view
from sgl_core._devices import usable_device
from sgl_core._indexer import IndexerRows, check_indexer
from sgl_core._kv_protocols import MLADevicePool
from sgl_core._shapes import MLAShape
from sgl_core._slot_geometry import SlotGeometry, check_pool_geometry
from sgl_core._validation import (
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
    check_value_rows,
)
from sgl_core.errors import PoolMismatchError, PoolSizeError

__all__ = [
    "MLAPoolGeometry",
    "PerLayerMLADevicePool",
    "check_pool_geometry",
    "check_raw_rows",
    "device_layers",
    "stacked_layers",
]


class MLAPoolGeometry(SlotGeometry):
    """Geometry every MLA device pool reports (the ``MLADevicePool`` properties).

    Backend authors subclass it, call ``__init__`` first, then allocate their
    buffers; override ``device`` to report the buffers' own device.
    """

    shape: MLAShape

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: torch.device,
        kv_cache_dim: int | None = None,
    ) -> None:
        check_pool_geometry(size, page_size)
        self.shape = MLAShape(layer_num, kv_lora_rank, qk_rope_head_dim, dtype, kv_cache_dim)
        self._set_slots(size, page_size, device)

    @property
    def kv_lora_rank(self) -> int:
        return self.shape.kv_lora_rank

    @property
    def qk_rope_head_dim(self) -> int:
        return self.shape.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        return self.shape.kv_cache_dim


class PerLayerMLADevicePool(MLAPoolGeometry, IndexerRows):
    """``kv_buffer[layer]`` is a ``(size + page_size, 1, kv_cache_dim)`` tensor.

    Slot 0 (the first page) is the engine's padding page, valid to address but
    never handed out by an allocator. With ``layers_in_one_allocation`` the
    layers are equally spaced views of one tensor, which lets the ``direct``
    io backend move a run of pages for every layer in one strided copy;
    subclasses that want one allocation per layer set it to False.

    ``kv_cache_dim`` makes each row that many elements of ``dtype`` whatever
    the rank split (a packed row the engine quantizes itself, e.g. 656
    ``uint8`` for DeepSeek-V3.2's FP8 MLA): such rows are written and read
    with :meth:`set_kv_rows` / :meth:`get_kv_rows`, and the split accessors
    ``set_mla_kv_buffer`` / ``get_mla_kv_buffer`` raise ``PoolMismatchError``.
    ``index_head_dim`` (with ``indexer_layer_ids``, ``with_index_k_scale``)
    adds the sparse-attention indexer cache (``sgl_core._indexer``).
    """

    layers_in_one_allocation: ClassVar[bool] = True

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        kv_cache_dim: int | None = None,
        index_head_dim: int | None = None,
        indexer_layer_ids: Iterable[int] | None = None,
        with_index_k_scale: bool = False,
    ) -> None:
        super().__init__(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            layer_num=layer_num,
            device=usable_device(device),
            kv_cache_dim=kv_cache_dim,
        )
        self.indexer = check_indexer(
            index_head_dim, indexer_layer_ids, with_index_k_scale, layer_num
        )
        layer_shape = (size + page_size, 1, self.shape.kv_cache_dim)
        try:
            if self.layers_in_one_allocation:
                stacked = torch.zeros((layer_num, *layer_shape), dtype=dtype, device=self._device)
                self.kv_buffer: list[torch.Tensor] = list(stacked.unbind(0))
            else:
                self.kv_buffer = [
                    torch.zeros(layer_shape, dtype=dtype, device=self._device)
                    for _ in range(layer_num)
                ]
            self._allocate_indexer(size + page_size, self.layers_in_one_allocation)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"device pool does not fit on {self._device}: {exc}") from None

    @property
    def device(self) -> torch.device:
        return self.kv_buffer[0].device

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[check_layer_id(layer_id, self.layer_num)]

    def _check_loc(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        layer_id = check_layer_id(layer_id, self.layer_num)
        check_index_tensor(loc, "loc")
        check_index_device(loc, "loc", self.device)
        check_index_bounds(loc, self.slot_count, "loc")
        return loc.to(self.device)

    def set_mla_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        loc = self._check_loc(layer_id, loc)
        self._check_split_rows("set_mla_kv_buffer")
        n = loc.numel()
        for name, tensor, dim in (
            ("cache_k_nope", cache_k_nope, self.kv_lora_rank),
            ("cache_k_rope", cache_k_rope, self.qk_rope_head_dim),
        ):
            check_value_rows(tensor, name, (n, 1, dim), self.dtype)
        # fp8 caches move as bytes (no fp8 index kernels).
        parts = [byte_view(t.to(self.device)) for t in (cache_k_nope, cache_k_rope)]
        byte_view(self.kv_buffer[layer_id]).index_copy_(0, loc, torch.cat(parts, dim=-1))

    def get_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self._check_loc(layer_id, loc)
        self._check_split_rows("get_mla_kv_buffer")
        rows = byte_view(self.kv_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        return rows[..., : self.kv_lora_rank], rows[..., self.kv_lora_rank :]

    def _check_split_rows(self, what: str) -> None:
        if self.shape.packed:
            raise PoolMismatchError(
                f"{what}: this pool's rows are {self.kv_cache_dim} packed {self.dtype} elements "
                f"(kv_cache_dim given), not kv_lora_rank={self.kv_lora_rank} + "
                f"qk_rope_head_dim={self.qk_rope_head_dim} values; use set_kv_rows / get_kv_rows"
            )

    # ------------------------------------------------------------- raw rows
    def set_kv_rows(self, layer_id: int, loc: torch.Tensor, rows: torch.Tensor) -> None:
        """Write raw ``(n, kv_cache_dim)`` rows of the pool's dtype at token ``loc``.

        The bytes land as given (no conversion): rows of another dtype or
        shape are ``PoolMismatchError``, before anything is written.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        loc = self._check_loc(layer_id, loc)
        check_raw_rows(rows, loc.numel(), self.kv_cache_dim, self.dtype)
        byte_view(self.kv_buffer[layer_id][:, 0]).index_copy_(
            0, loc, byte_view(rows.to(self.device).contiguous())
        )

    def get_kv_rows(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """A copy of the raw ``(n, kv_cache_dim)`` rows at token ``loc``, of the pool's dtype."""
        loc = self._check_loc(layer_id, loc)
        return byte_view(self.kv_buffer[layer_id][:, 0]).index_select(0, loc).view(self.dtype)


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


def device_layers(device_pool: MLADevicePool) -> list[torch.Tensor]:
    """The per-layer ``kv_buffer`` list of a device pool, or ``PoolMismatchError``."""
    layers = getattr(device_pool, "kv_buffer", None)
    if not isinstance(layers, list) or len(layers) != device_pool.layer_num:
        raise PoolMismatchError(
            f"{type(device_pool).__name__} has no per-layer kv_buffer list; "
            "this host pool needs a per-layer device pool (torch or cuda backend)"
        )
    return layers
