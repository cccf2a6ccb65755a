"""Host pool of the Ascend backend: layout ``page_first_kv_split``, io ``kernel_ascend``.

Host tensors are page-major mirrors of the device pool's components::

    k_buffer             (page_num, layer_num,          page_size, 1, kv_lora_rank)
    v_buffer             (page_num, layer_num,          page_size, 1, qk_rope_head_dim)
    index_k_buffer       (page_num, num_indexer_layers, page_size, 1, index_head_dim)
    index_k_scale_buffer (page_num, num_indexer_layers, page_size, 1, 1)  float32

(the indexer mirrors exist exactly when the device pool has them). One page
of one component, ``buffer[p]``, is a contiguous ``(rows, page_size, 1, dim)``
block, so a page is four contiguous memory objects.

**Flat L3 page** (``get_data_page`` / ``set_from_flat_data_page`` /
``get_dummy_flat_data_page``): the bytes of ``k_buffer[p]``, then
``v_buffer[p]``, then ``index_k_buffer[p]``, then ``index_k_scale_buffer[p]``
(components the pool lacks are skipped), concatenated. Its dtype is the KV
dtype when every component shares it; when the fp32 scale component exists
the page is mixed-dtype and is returned as a ``torch.uint8`` byte tensor
instead (``flat_page_dtype``). ``get_page_buffer_meta`` lists, per page, the
pointer and byte size of each of those objects in the same order, so the
objects concatenated are exactly the flat page's bytes.

Transfers move whole pages only (page-granular): indices must be
page-aligned contiguous runs, which the ``sgl_core`` base validates before
any byte moves. Backup copies every layer and component in one call; load
copies one layer (plus its indexer row, if the layer has one) and leaves
every other layer of the device pool untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from sgl_ascend import _npu
from sgl_ascend._device_pool import AscendMLADevicePool
from sgl_ascend._engine_pool import engine_view
from sgl_ascend._transfer import KvSplitMover
from sgl_core.backend import (
    CopyTuning,
    HostLayout,
    IOBackend,
    MLADevicePool,
    MLAHostPoolBase,
    check_backed,
    check_layer_id,
    page_aligned_zeros,
)
from sgl_core.errors import ArgumentTypeError, PoolMismatchError

__all__ = ["AscendMLAHostPool"]


def _indexer_config(pool: AscendMLADevicePool) -> tuple[int | None, tuple[int, ...], bool]:
    return pool.index_head_dim, pool.indexer_layer_ids, pool.has_index_k_scale


class AscendMLAHostPool(MLAHostPoolBase):
    """``page_first_kv_split`` host pool for :class:`AscendMLADevicePool` device pools."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, Callable[[Any], Any]]]] = {
        HostLayout.PAGE_FIRST_KV_SPLIT: {IOBackend.KERNEL_ASCEND: KvSplitMover}
    }

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor | None
    index_k_buffer: torch.Tensor | None
    index_k_scale_buffer: torch.Tensor | None

    def _make_mover(self, factory: Callable[[Any], Any]) -> Any:
        # This backend's movers read the pool (its buffers and plans).
        return factory(self)

    def __init__(
        self,
        device_pool: MLADevicePool,
        *,
        layout: HostLayout | str = HostLayout.PAGE_FIRST_KV_SPLIT,
        host_to_device_ratio: float = 2.0,
        host_size_gb: float = 0.0,
        pin_memory: bool | None = None,
        io_backend: IOBackend | str | None = None,
        tuning: CopyTuning | None = None,
    ) -> None:
        super().__init__(
            engine_view(device_pool),  # SGLang's NPU pool: its own tensors, seen as ours
            layout=layout,
            host_to_device_ratio=host_to_device_ratio,
            host_size_gb=host_size_gb,
            pin_memory=pin_memory,
            io_backend=io_backend,
            tuning=tuning,
        )

    # ----------------------------------------------------------------- hooks
    def _as_device_pool(self, device_pool: MLADevicePool) -> MLADevicePool:
        # Transfers take SGLang's NPU pool too: the same cached view as at construction.
        return super()._as_device_pool(engine_view(device_pool))

    def _configure(self, device_pool: MLADevicePool) -> None:
        # After the layout check (unsupported layouts fail first, by name).
        self._indexer = _indexer_config(self._ascend_pool(device_pool))

    def _pin_policy(self, requested: bool | None, device: torch.device) -> bool:
        return _npu.pin_host_memory(requested, device, super()._pin_policy(requested, device))

    @staticmethod
    def _ascend_pool(device_pool: MLADevicePool) -> AscendMLADevicePool:
        if not isinstance(device_pool, AscendMLADevicePool):
            raise PoolMismatchError(
                f"device_pool is a {type(device_pool).__name__}; layout 'page_first_kv_split' "
                "needs the contiguous multi-layer AscendMLADevicePool (backend 'ascend')"
            )
        return device_pool

    def _check_device_pool_kind(self, device_pool: MLADevicePool) -> None:
        pool = self._ascend_pool(device_pool)
        theirs = _indexer_config(pool)
        if theirs != self._indexer:
            raise PoolMismatchError(
                "device_pool indexer (index_head_dim, indexer_layer_ids, has_index_k_scale) = "
                f"{theirs}, expected {self._indexer}"
            )
        # The buffers are plain attributes: one replaced, resized or ``set_`` since
        # the pool was built must still be what the copies address.
        device = pool.k_buffer.device
        named = pool.named_components
        if len(named) != len(self.buffers):  # e.g. a v_buffer removed or added
            raise PoolMismatchError(
                f"device_pool has components {[n for n, _ in named]}, expected "
                f"{len(self.buffers)} matching this host pool"
            )
        for (name, dev), host in zip(named, self.buffers, strict=True):
            expected = (host.shape[1], pool.page_num, *host.shape[2:])
            if (
                not isinstance(dev, torch.Tensor)
                or tuple(dev.shape) != expected
                or dev.dtype != host.dtype
                or dev.device != device
                or not dev.is_contiguous()
            ):
                got = (
                    f"{tuple(dev.shape)} {dev.dtype} on {dev.device}"
                    if isinstance(dev, torch.Tensor)
                    else type(dev).__name__
                )
                raise PoolMismatchError(
                    f"device_pool.{name} must be a contiguous {expected} {host.dtype} tensor "
                    f"on {device}, got {got}"
                )
            check_backed(dev, f"device_pool.{name}")

    def _layer_storage(self, device_pool: MLADevicePool, layer_id: int) -> Sequence[torch.Tensor]:
        return self._device_buffers(self._ascend_pool(device_pool))

    def _bytes_per_token(self, device_pool: MLADevicePool) -> int:
        head_dim, layers, scale = self._indexer
        per_indexer_row = (head_dim or 0) * self.shape.itemsize + (4 if scale else 0)
        return self.shape.layout_dim + len(layers) * per_indexer_row

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return True

    def _allocate_buffers(self, device_pool: MLADevicePool) -> None:
        pages = (self.page_num, self.layer_num, self.page_size, 1)
        self.v_buffer = None
        if self.shape.packed:  # one component holds the whole engine-packed row
            self.k_buffer = self._zeros((*pages, self.kv_cache_dim), self.dtype)
        else:
            self.k_buffer = self._zeros((*pages, self.shape.kv_lora_rank), self.dtype)
            self.v_buffer = self._zeros((*pages, self.shape.qk_rope_head_dim), self.dtype)
        self.index_k_buffer = None
        self.index_k_scale_buffer = None
        head_dim, layers, scale = self._indexer
        if head_dim is not None:
            ipages = (self.page_num, len(layers), self.page_size, 1)
            self.index_k_buffer = self._zeros((*ipages, head_dim), self.dtype)
            if scale:
                self.index_k_scale_buffer = self._zeros((*ipages, 1), torch.float32)

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return page_aligned_zeros(shape, dtype, pin_memory=self.pin_memory)

    # ---------------------------------------------------------- components
    @property
    def indexer_layer_ids(self) -> tuple[int, ...]:
        """Model layers with an indexer row (empty when the pool has no indexer)."""
        return self._indexer[1]

    @property
    def buffers(self) -> list[torch.Tensor]:
        """Host components in flat-page order: k[, v][, index_k[, index_k_scale]]."""
        parts = (self.k_buffer, self.v_buffer, self.index_k_buffer, self.index_k_scale_buffer)
        return [b for b in parts if b is not None]

    @staticmethod
    def _device_buffers(pool: AscendMLADevicePool) -> list[torch.Tensor]:
        return pool.components

    def layer_views(
        self, device_pool: MLADevicePool, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(device_rows, host_pages)`` of ``k``, ``v`` (if any) and the layer's indexer rows."""
        layer_id = check_layer_id(layer_id, self.layer_num)
        self.check_device_pool(device_pool)
        pool = self._ascend_pool(device_pool)
        views = []
        kv = pool.kv_components
        slot = pool.indexer_slot(layer_id)
        rows = [layer_id] * kv + ([] if slot is None else [slot] * (len(self.buffers) - kv))
        for dev, host, row in zip(pool.components, self.buffers, rows, strict=False):
            part = dev[row]
            views.append((part.reshape(-1, part.shape[-1]), host[:, row, :, 0]))
        return views

    # -------------------------------------------------------------- L3 pages
    @property
    def flat_page_dtype(self) -> torch.dtype:
        """KV dtype, or ``torch.uint8`` (raw bytes) when the fp32 scale component exists."""
        return torch.uint8 if self.index_k_scale_buffer is not None else self.dtype

    def _object_bytes(self) -> list[int]:
        return [b[0].numel() * b.element_size() for b in self.buffers]

    @property
    def flat_page_numel(self) -> int:
        itemsize = torch.empty((), dtype=self.flat_page_dtype).element_size()
        return sum(self._object_bytes()) // itemsize

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of the page at token ``index`` in flat-page order (1-D even when not ``flat``).

        The components of a kv-split page have different shapes, so there is
        no single non-flat shape; ``flat=False`` returns the same 1-D page.
        """
        page = self._check_page_start(index) // self.page_size
        parts = [b[page].reshape(-1).view(self.flat_page_dtype) for b in self.buffers]
        return torch.cat(parts)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self._check_page_start(index) // self.page_size
        if not isinstance(data_page, torch.Tensor):
            raise ArgumentTypeError(
                f"data_page must be a torch.Tensor, got {type(data_page).__name__}"
            )
        if data_page.dtype != self.flat_page_dtype or data_page.numel() != self.flat_page_numel:
            raise PoolMismatchError(
                f"data_page must hold {self.flat_page_numel} elements of {self.flat_page_dtype}, "
                f"got {data_page.numel()} of {data_page.dtype}"
            )
        flat = data_page.reshape(-1).contiguous()
        itemsize = flat.element_size()
        offset = 0
        for buffer, nbytes in zip(self.buffers, self._object_bytes(), strict=True):
            part = flat[offset // itemsize : (offset + nbytes) // itemsize]
            if part.storage_offset() * itemsize % buffer.element_size():
                part = part.clone()  # a dtype view needs an aligned storage offset
            offset += nbytes
            buffer[page].copy_(part.view(buffer.dtype).view(buffer[page].shape))

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(
            self.flat_page_numel, dtype=self.flat_page_dtype, pin_memory=self.pin_memory
        )

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """Per page: k, v[, index_k, index_k_scale] pointers and byte sizes, in flat order."""
        pages = [s // self.page_size for s in self._page_starts(indices)]
        objects = list(zip(self.buffers, self._object_bytes(), strict=True))
        ptrs = [b.data_ptr() + p * nbytes for p in pages for b, nbytes in objects]
        sizes = [nbytes for _ in pages for _, nbytes in objects]
        return ptrs, sizes

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Base pointer, total bytes and per-page object bytes of each host component."""
        buffers = self.buffers
        return (
            [b.data_ptr() for b in buffers],
            [b.numel() * b.element_size() for b in buffers],
            self._object_bytes(),
        )
