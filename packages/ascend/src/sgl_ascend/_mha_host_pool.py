"""MHA / GQA host pool of the Ascend backend: ``page_first_kv_split``, io ``kernel_ascend``.

``page_first_direct`` names the same pool (the Ascend engine's name for it).

Host tensors are page-major mirrors of :class:`AscendMHADevicePool`'s two
layer-major tensors (docs/design.md, "Ascend MHA")::

    k_buffer (page_num, layer_num, page_size, head_num, head_dim)
    v_buffer (page_num, layer_num, page_size, head_num, v_head_dim)

One page of one component, ``buffer[p]``, is a contiguous
``(layer_num, page_size, head_num, dim)`` block, so a page is two memory
objects: K, then V.

**Flat L3 page** (``get_data_page`` / ``set_from_flat_data_page`` /
``get_dummy_flat_data_page``): the bytes of ``k_buffer[p]`` then
``v_buffer[p]``, in the pool's dtype. That is also the byte order of the
Ascend serving engine's own MHA host page (it names the layout
``page_first_direct``: one ``(2, page_num, layer_num, page_size, head_num,
head_dim)`` tensor, or, for ``v_head_dim != head_dim``, two tensors shaped as
above). ``get_page_buffer_meta`` lists, per
page, the pointer and byte size of the K object then the V object.

Transfers move whole pages only; the ``sgl_core`` base validates every
argument before any byte moves. Backup copies every layer of K and V; a load
copies only layer ``layer_id``'s K and V rows (the engine's own load moves
every layer at layer 0), through the same kv-split mover as the MLA pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from sgl_ascend import _npu
from sgl_ascend._engine_pool import engine_view
from sgl_ascend._mha_device_pool import AscendMHADevicePool
from sgl_ascend._transfer import KvSplitMover
from sgl_core.backend import (
    CopyTuning,
    HostLayout,
    IOBackend,
    MHADevicePool,
    MHAHostPoolBase,
    check_backed,
    check_layer_id,
    page_aligned_zeros,
)
from sgl_core.errors import PoolMismatchError

__all__ = ["AscendMHAHostPool"]

_NAMES = ("k_buffer", "v_buffer")


class AscendMHAHostPool(MHAHostPoolBase):
    """``page_first_kv_split`` (or ``page_first_direct``) host pool for Ascend MHA device pools."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, Callable[[Any], Any]]]] = {
        HostLayout.PAGE_FIRST_KV_SPLIT: {IOBackend.KERNEL_ASCEND: KvSplitMover},
        # The Ascend engine's own name for this pairing (SGLang's NPU default for
        # MHA models): the same tensors, byte order, movers and page objects, so an
        # engine passing its own layout string gets this pool. The L3 page format
        # records the layout name, so pages of the two names miss each other.
        HostLayout.PAGE_FIRST_DIRECT: {IOBackend.KERNEL_ASCEND: KvSplitMover},
    }

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor

    def _make_mover(self, factory: Callable[[Any], Any]) -> Any:
        # This backend's movers read the pool (its buffers and plans).
        return factory(self)

    def __init__(
        self,
        device_pool: MHADevicePool,
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
    def _as_device_pool(self, device_pool: MHADevicePool) -> MHADevicePool:
        # Transfers take SGLang's NPU pool too: the same cached view as at construction.
        return super()._as_device_pool(engine_view(device_pool))

    def _configure(self, device_pool: MHADevicePool) -> None:
        # After the layout check (unsupported layouts fail first, by name).
        _ascend_pool(device_pool)

    def _pin_policy(self, requested: bool | None, device: torch.device) -> bool:
        return _npu.pin_host_memory(requested, device, super()._pin_policy(requested, device))

    def _check_device_pool_kind(self, device_pool: MHADevicePool) -> None:
        pool = _ascend_pool(device_pool)
        # The buffers are plain attributes: one replaced, resized or ``set_`` since
        # the pool was built must still be what the copies address.
        device = pool.k_buffer.device
        for name, dev, host in zip(_NAMES, pool.components, self.buffers, strict=True):
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

    def _layer_storage(self, device_pool: MHADevicePool, layer_id: int) -> Sequence[torch.Tensor]:
        return _ascend_pool(device_pool).components

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return True

    def _allocate_buffers(self, device_pool: MHADevicePool) -> None:
        shape = self.shape
        pages = (self.page_num, self.layer_num, self.page_size, shape.head_num)
        self.k_buffer = self._zeros((*pages, shape.head_dim))
        self.v_buffer = self._zeros((*pages, shape.v_head_dim))

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return page_aligned_zeros(shape, self.dtype, pin_memory=self.pin_memory)

    # ---------------------------------------------------------- components
    @property
    def buffers(self) -> list[torch.Tensor]:
        """Host components in flat-page order: k, v."""
        return [self.k_buffer, self.v_buffer]

    def layer_views(
        self, device_pool: MHADevicePool, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(device_rows (slots, heads * dim), host_pages (pages, page_size, heads * dim))``.

        For ``k`` then ``v`` of one layer; views of the pools' own memory.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        self.check_device_pool(device_pool)
        pool = _ascend_pool(device_pool)
        views = []
        for dev, host in zip(pool.components, self.buffers, strict=True):
            width = int(host.shape[3] * host.shape[4])
            rows = dev[layer_id].reshape(-1, width)
            views.append((rows, host[:, layer_id].reshape(self.page_num, self.page_size, width)))
        return views

    # -------------------------------------------------------------- L3 pages
    def _object_bytes(self) -> list[int]:
        return [b[0].numel() * b.element_size() for b in self.buffers]

    @property
    def flat_page_numel(self) -> int:
        return sum(b[0].numel() for b in self.buffers)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of the page at token ``index``: K then V (1-D even when not ``flat``).

        K and V pages have different shapes when ``v_head_dim != head_dim``, so
        there is no single non-flat shape; ``flat=False`` returns the same 1-D page.
        """
        page = self._check_page_start(index) // self.page_size
        return torch.cat([b[page].reshape(-1) for b in self.buffers])

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self._check_page_start(index) // self.page_size
        self._check_flat_page(data_page, self.flat_page_numel)
        flat = data_page.reshape(-1)
        offset = 0
        for buffer in self.buffers:
            n = buffer[page].numel()
            buffer[page].copy_(flat[offset : offset + n].view(buffer[page].shape))
            offset += n

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.flat_page_numel, dtype=self.dtype, pin_memory=self.pin_memory)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """Per page: the K then the V object's pointer and byte size (flat-page order)."""
        pages = [s // self.page_size for s in self._page_starts(indices)]
        objects = list(zip(self.buffers, self._object_bytes(), strict=True))
        ptrs = [b.data_ptr() + p * nbytes for p in pages for b, nbytes in objects]
        sizes = [nbytes for _ in pages for _, nbytes in objects]
        return ptrs, sizes

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """Base pointer, total bytes and per-page object bytes of K and V."""
        buffers = self.buffers
        return (
            [b.data_ptr() for b in buffers],
            [b.numel() * b.element_size() for b in buffers],
            self._object_bytes(),
        )


def _ascend_pool(device_pool: object) -> AscendMHADevicePool:
    if not isinstance(device_pool, AscendMHADevicePool):
        raise PoolMismatchError(
            f"device_pool is a {type(device_pool).__name__}; the Ascend MHA host pool "
            "needs the contiguous multi-layer AscendMHADevicePool (backend 'ascend')"
        )
    return device_pool
