"""Plumbing shared by backends whose pools are one device and one host class."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

import torch

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._host_pool import MLAHostPoolBase
from sgl_core._protocols import MLADevicePool

__all__ = ["PoolBackend"]

DeviceT = TypeVar("DeviceT", bound=MLADevicePool)
HostT = TypeVar("HostT", bound=MLAHostPoolBase)


class PoolBackend(Generic[DeviceT, HostT]):
    """A ``Backend`` built from a device-pool factory and a host-pool class.

    Backend authors subclass it, set ``name`` and ``is_available``, and pass
    their two pool classes; ``supported_pairs`` is the host class's.
    """

    name = "unnamed"

    def __init__(
        self, device_pool_class: Callable[..., DeviceT], host_pool_class: type[HostT]
    ) -> None:
        self._device_pool_class = device_pool_class
        self._host_pool_class = host_pool_class

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def supported_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        return self._host_pool_class.supported_pairs

    def is_available(self) -> bool:
        return True

    def create_device_pool(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
    ) -> DeviceT:
        return self._device_pool_class(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            layer_num=layer_num,
            device=device,
        )

    def create_host_pool(
        self,
        device_pool: MLADevicePool,
        *,
        layout: HostLayout | str,
        host_to_device_ratio: float = 2.0,
        host_size_gb: float = 0.0,
        pin_memory: bool | None = None,
        io_backend: IOBackend | str | None = None,
    ) -> HostT:
        return self._host_pool_class(
            device_pool,
            layout=layout,
            host_to_device_ratio=host_to_device_ratio,
            host_size_gb=host_size_gb,
            pin_memory=pin_memory,
            io_backend=io_backend,
        )
