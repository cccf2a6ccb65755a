"""What every KV pool kind (MLA, MHA) shares, and how a device pool's kind is told.

The host-pool base (``HostPoolBase``) and the mover seam (``Transfer``,
``Mover``) are generic over the device-pool protocol of one kind:
``MLADevicePool`` or ``MHADevicePool``. They need from it only
:class:`DevicePoolGeometry`; each kind's base adds its own shape checks.
A device pool is MHA when it reports ``head_num`` and no ``kv_lora_rank``
(:func:`is_mha_device_pool`), so SGLang's own pools dispatch by attributes,
never by class.
"""

from __future__ import annotations

from typing import Protocol, Union

import torch

from sgl_core._mha_protocols import MHAHostPool
from sgl_core._protocols import MLAHostPool

__all__ = ["DevicePoolGeometry", "KVHostPool", "PoolShape", "is_mha_device_pool"]

#: A host pool of either kind: what L3 page stores accept (they read only the
#: members both protocols share: layout, sizes, dtype and the L3 page helpers).
KVHostPool = Union[MLAHostPool, MHAHostPool]  # noqa: UP007  (a runtime alias on 3.10)


class DevicePoolGeometry(Protocol):
    """Token slots ``[0, size + page_size)`` in pages of ``page_size``, on one device."""

    @property
    def size(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def layer_num(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def device(self) -> torch.device: ...


class PoolShape(Protocol):
    """The per-token geometry a host pool sizes itself with (``MLAShape``, ``MHAShape``)."""

    @property
    def layer_num(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def layout_dim(self) -> int:
        """Host bytes of one token across every layer and component."""
        ...


def is_mha_device_pool(device_pool: object) -> bool:
    """True for an MHA/GQA device pool: ``head_num`` and no MLA ``kv_lora_rank``."""
    return hasattr(device_pool, "head_num") and not hasattr(device_pool, "kv_lora_rank")
