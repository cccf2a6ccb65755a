"""The one host pool of the Ascend backend: layout ``page_first_kv_split``, io ``kernel_ascend``.

Page-major mirrors of the device pool's components (docs/design.md, host
layouts). For MHA that is also the Ascend engine's ``page_first_direct`` host
page: that name builds the same pool (the L3 format records the name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, TypeVar

import torch

from sgl_ascend._device_kinds import AscendMHADevicePool, AscendMLADevicePool, engine_view
from sgl_ascend._device_pool import AscendDevicePool, KvSplitSpec
from sgl_ascend._transfer import KvSplitMover
from sgl_core.backend import (
    CopyTuning,
    DevicePoolGeometry,
    HostLayout,
    HostPart,
    IOBackend,
    KVSpec,
    MHADevicePool,
    MHAHostPoolBase,
    MHAShape,
    MLADevicePool,
    MLAHostPoolBase,
    MLAShape,
    MoverFactory,
    PoolShape,
    TokenPages,
    check_backed,
    check_layer_id,
    layout_facts,
    page_aligned_zeros,
)
from sgl_core.errors import PoolMismatchError

__all__ = ["AscendHostPool", "AscendMHAHostPool", "AscendMLAHostPool"]

DevT = TypeVar("DevT", bound=DevicePoolGeometry)
ShapeT = TypeVar("ShapeT", bound=PoolShape)

_KERNEL: Mapping[IOBackend, MoverFactory] = {IOBackend.KERNEL_ASCEND: KvSplitMover}


def _describe(spec: KVSpec) -> str:
    return ", ".join(
        f"{c.name} {c.heads}x{c.dim} {c.dtype}"
        + ("" if c.layers is None else f" on layers {list(c.layers)}")
        for c in spec.components
    )


class AscendHostPool(TokenPages[DevT, ShapeT]):
    """``page_first_kv_split`` host pool over an Ascend device pool's components (any kind)."""

    #: The device-pool class this kind mirrors (checked by ``isinstance``); its
    #: ``optional_buffers`` are this pool's too (None when the spec lacks them).
    device_pool_class: ClassVar[type[AscendDevicePool]]

    #: The device pool's components (its kv-split spec).
    spec: KvSplitSpec
    k_buffer: torch.Tensor

    def __init__(
        self,
        device_pool: DevT,
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
    def _as_device_pool(self, device_pool: DevT) -> DevT:
        # Transfers take SGLang's NPU pool too: the same cached view as at construction.
        view: DevT = engine_view(device_pool)
        return super()._as_device_pool(view)

    def _ascend(self, device_pool: object) -> AscendDevicePool:
        cls = self.device_pool_class
        if not isinstance(device_pool, cls):
            raise PoolMismatchError(
                f"device_pool is a {type(device_pool).__name__}; layout "
                f"'{self.layout.value}' needs the contiguous multi-layer {cls.__name__} "
                "(backend 'ascend')"
            )
        return device_pool

    def _configure(self, device_pool: DevT) -> None:
        # After the layout check (unsupported layouts fail first, by name).
        self._ascend(device_pool)

    def _read_spec(self, device_pool: DevT) -> KvSplitSpec:
        # The device pool declares its components (checked against it in check_device_pool).
        return self._ascend(device_pool).spec

    def _pin_policy(self, requested: bool | None, device: torch.device) -> bool:
        """Host pools of NPU device pools are pinned unless ``requested is False``."""
        if device.type == "npu" and requested is not False:
            return True
        return super()._pin_policy(requested, device)

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return True

    def _allocate_buffers(self, device_pool: DevT) -> None:
        self._facts = facts = layout_facts(self.layout)
        for name in self.device_pool_class.optional_buffers:
            setattr(self, name, None)
        parts = []
        for c in self.spec.components:
            shape = facts.shape(c.rows(self.layer_num), self.size, self.page_size, c.heads, c.dim)
            buffer = page_aligned_zeros(shape, c.dtype, pin_memory=self.pin_memory)
            setattr(self, c.device_name, buffer)
            parts.append(HostPart(c, buffer))
        #: Host buffers in spec (flat-page) order.
        self._parts = tuple(parts)

    def _check_device_pool_kind(self, device_pool: DevT) -> None:
        pool = self._ascend(device_pool)
        if pool.spec != self.spec:
            raise PoolMismatchError(
                f"device_pool rows are [{_describe(pool.spec)}], expected [{_describe(self.spec)}]"
            )
        # The buffers are plain attributes: one replaced, resized or ``set_`` since
        # the pool was built must still be what the copies address.
        device = pool.k_buffer.device
        named = pool.named_components
        if len(named) != len(self._parts):  # e.g. a v_buffer removed
            raise PoolMismatchError(
                f"device_pool has components {[n for n, _ in named]}, expected "
                f"{[p.component.device_name for p in self._parts]} matching this host pool"
            )
        for part in self._parts:
            name, dtype = part.component.device_name, part.component.dtype
            dev = getattr(pool, name)
            expected = pool.component_shape(part.component)
            if (
                not isinstance(dev, torch.Tensor)
                or tuple(dev.shape) != expected
                or dev.dtype != dtype
                or dev.device != device
                or not dev.is_contiguous()
            ):
                got = (
                    f"{tuple(dev.shape)} {dev.dtype} on {dev.device}"
                    if isinstance(dev, torch.Tensor)
                    else type(dev).__name__
                )
                raise PoolMismatchError(
                    f"device_pool.{name} must be a contiguous {expected} {dtype} tensor "
                    f"on {device}, got {got}"
                )
            check_backed(dev, f"device_pool.{name}")

    def _layer_storage(self, device_pool: DevT, layer_id: int) -> Sequence[torch.Tensor]:
        return self._ascend(device_pool).components

    # ---------------------------------------------------------- components
    @property
    def buffers(self) -> list[torch.Tensor]:
        """Host components in flat-page order (MLA: k[, v][, index_k[, index_k_scale]])."""
        return [p.buffer for p in self._parts]

    def layer_views(
        self, device_pool: DevT, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(device_rows (slots, heads * dim), host_pages (pages, page_size, heads * dim))``.

        Per component that keeps a row for layer ``layer_id`` (every-layer rows,
        then the layer's indexer rows); views of the pools' own memory.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        self.check_device_pool(device_pool)
        pool = self._ascend(device_pool)
        views = []
        for part in self._parts:
            row = part.component.slot(layer_id)
            if row is None:
                continue
            width = part.component.elements
            dev = getattr(pool, part.component.device_name)[row].reshape(-1, width)
            views.append((dev, part.buffer[:, row].reshape(self.page_num, self.page_size, width)))
        return views

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of the page at token ``index`` in flat-page order (1-D even when not ``flat``).

        The components of a kv-split page have different shapes, so there is
        no single non-flat shape; ``flat=False`` returns the same 1-D page.
        """
        return super().get_data_page(index, True)


class AscendMLAHostPool(AscendHostPool[MLADevicePool, MLAShape], MLAHostPoolBase):
    """``page_first_kv_split`` host pool for :class:`AscendMLADevicePool` device pools."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        HostLayout.PAGE_FIRST_KV_SPLIT: _KERNEL
    }
    device_pool_class = AscendMLADevicePool

    v_buffer: torch.Tensor | None
    index_k_buffer: torch.Tensor | None
    index_k_scale_buffer: torch.Tensor | None

    @property
    def indexer_layer_ids(self) -> tuple[int, ...]:
        """Model layers with an indexer row, in slot order (empty when the pool has no indexer)."""
        keys = self.spec.component("index_k").layers if self.spec.has("index_k") else None
        return () if keys is None else keys

    @property
    def flat_page_dtype(self) -> torch.dtype:
        """KV dtype, or ``torch.uint8`` (raw bytes) when the fp32 scale component exists."""
        return self.spec.flat_page_dtype


class AscendMHAHostPool(AscendHostPool[MHADevicePool, MHAShape], MHAHostPoolBase):
    """``page_first_kv_split`` (or ``page_first_direct``) host pool for Ascend MHA device pools."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        HostLayout.PAGE_FIRST_KV_SPLIT: _KERNEL,
        # The Ascend engine's own name for this pairing (SGLang's NPU default for
        # MHA models): the same tensors, byte order, movers and page objects, so an
        # engine passing its own layout string gets this pool. The L3 page format
        # records the layout name, so pages of the two names miss each other.
        HostLayout.PAGE_FIRST_DIRECT: _KERNEL,
    }
    device_pool_class = AscendMHADevicePool

    v_buffer: torch.Tensor
