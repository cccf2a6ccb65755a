"""The seam between a host pool and how it moves bytes: ``Transfer`` and ``Mover``.

How a validated ``Transfer`` reaches a mover, and why a plan keyed by its
identity is never stale: docs/design.md, "The mover seam".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, Protocol

import torch
from typing_extensions import TypeVar  # TypeVar defaults (PEP 696); it comes with torch

from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._spec import Component
from sgl_core.kv.protocols._kv_protocols import DevicePoolGeometry, MLADevicePool
from sgl_core.transfer.copy._tuning import CopyTuning

__all__ = [
    "HostPart",
    "HostSide",
    "Mover",
    "MoverFactory",
    "PlanCache",
    "Transfer",
]

# The device-pool kind of a transfer; a bare ``Transfer`` / ``Mover`` is the MLA one
# (MHA host pools hand down ``Transfer[MHADevicePool]`` to a ``Mover[MHADevicePool]``).
PoolT_co = TypeVar("PoolT_co", bound=DevicePoolGeometry, covariant=True, default=MLADevicePool)
PoolT_contra = TypeVar(
    "PoolT_contra", bound=DevicePoolGeometry, contravariant=True, default=MLADevicePool
)
TransferT = TypeVar("TransferT", bound="Transfer[Any]")


@dataclasses.dataclass(frozen=True, eq=False)
class Transfer(Generic[PoolT_co]):
    """One validated transfer: what a mover may assume without checking.

    ``host_indices`` and ``device_indices`` are 1-D ``torch.int64`` token
    indices of equal length, in range, with a duplicate-free destination,
    whole aligned pages where the pair is page-granular, on the CPU or the
    device pool's device. ``device_pool`` matches the host pool (geometry and
    storage kind) and ``io`` is the io backend of the mover it is handed to.
    """

    device_pool: PoolT_co
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    io: IOBackend

    @property
    def count(self) -> int:
        return int(self.host_indices.numel())


class Mover(Protocol[PoolT_contra]):
    """Moves the bytes of validated transfers for one (host pool, io backend)."""

    def backup(self, transfer: Transfer[PoolT_contra]) -> None:
        """Device -> host, every layer."""
        ...

    def load(self, transfer: Transfer[PoolT_contra], layer_id: int) -> None:
        """Host -> device, layer ``layer_id`` only (already checked in range)."""
        ...

    def check(self, device_pool: PoolT_contra) -> None:
        """Reject, with a typed error, a device pool this mover cannot run with.

        Called during validation, before any byte moves.
        """
        ...

    def synchronize(self) -> None:
        """Wait for every copy this mover queued (a no-op when copies are synchronous)."""
        ...


@dataclasses.dataclass(frozen=True)
class HostPart:
    """One component's host buffer, in its layout's dim order (``sgl_core.kv._layouts``)."""

    component: Component
    buffer: torch.Tensor


@dataclasses.dataclass(frozen=True)
class HostSide:
    """What a mover is built from: the host buffers and their geometry, never the pool.

    ``parts`` are in the spec's component order (the order of a flat page).
    """

    layout: HostLayout
    size: int
    page_size: int
    layer_num: int
    parts: tuple[HostPart, ...]
    tuning: CopyTuning | None
    pin_memory: bool


#: Builds a pool's mover once the pool has its buffers, from its ``HostSide``.
MoverFactory = Callable[[HostSide], Mover[Any]]

PlanT = TypeVar("PlanT")


class PlanCache(Generic[PlanT]):
    """The plan of the last transfer a mover loaded, reused while the transfer is the same.

    One ``(transfer, plan)`` tuple is swapped in at once, so a load thread and a
    write-back thread sharing a mover see either the old pair or the new one. The
    cache holds the transfer, so its identity cannot be recycled while the plan lives.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[Transfer[Any], PlanT] | None = None

    def get(self, transfer: TransferT, build: Callable[[TransferT], PlanT]) -> PlanT:
        """The plan of ``transfer``: the kept one if it is the same object, else a new one."""
        last = self._last
        if last is not None and last[0] is transfer:
            return last[1]
        plan = build(transfer)
        self._last = (transfer, plan)
        return plan

    def peek(self, transfer: Transfer[Any]) -> PlanT | None:
        """The kept plan when it belongs to ``transfer``, else None."""
        last = self._last
        return last[1] if last is not None and last[0] is transfer else None

    def put(self, transfer: Transfer[Any], plan: PlanT) -> None:
        self._last = (transfer, plan)
