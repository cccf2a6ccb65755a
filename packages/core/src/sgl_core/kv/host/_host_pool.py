"""Host-pool base shared by every backend and kind: sizing, accounting, validation, dispatch.

The public transfer methods validate *everything* first into a ``Transfer``
and then hand it to the ``movers`` entry of the io backend in one call, so a
mover may assume well-formed, in-range, duplicate-free arguments and never
has to undo a partial copy.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from sgl_core.errors import PoolMismatchError, PoolSizeError
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._memory import should_pin
from sgl_core.kv._spec import KVSpec
from sgl_core.kv._validation import (
    check_index_bounds,
    check_index_device,
    check_index_pair,
    check_layer_id,
    check_page_runs,
    check_unique,
    differing_fields,
)
from sgl_core.kv.device._slot_geometry import pool_repr
from sgl_core.kv.host._host_args import HostArguments, describe_pairs, size_argument
from sgl_core.kv.host._host_slots import HostSlots
from sgl_core.kv.host._load_memo import CheckedLoad, tensor_signature
from sgl_core.kv.protocols._kv_protocols import DevicePoolGeometry, PoolShape
from sgl_core.transfer._transfer import HostSide, Mover, Transfer
from sgl_core.transfer.copy._tuning import CopyTuning

__all__ = ["DevT", "HostPoolBase", "ShapeT", "describe_pairs"]

DevT = TypeVar("DevT", bound=DevicePoolGeometry)
ShapeT = TypeVar("ShapeT", bound=PoolShape)


class HostPoolBase(HostSlots, HostArguments, abc.ABC, Generic[DevT, ShapeT]):
    """Common behaviour of host pools of one device-pool kind ``DevT``, geometry ``ShapeT``."""

    shape: ShapeT

    def __init__(
        self,
        device_pool: DevT,
        *,
        layout: HostLayout | str,
        host_to_device_ratio: float = 2.0,
        host_size_gb: float = 0.0,
        pin_memory: bool | None = None,
        io_backend: IOBackend | str | None = None,
        tuning: CopyTuning | None = None,
    ) -> None:
        #: Path choices of this pool's direct copies; None: the device pool's preset.
        self.tuning = tuning
        self._layout = self._check_layout(layout, io_backend)
        #: The io backend transfers use when they are given none (None: they must name one).
        self.default_io_backend: IOBackend | None = (
            None if io_backend is None else self._check_io_backend(self._layout, io_backend)
        )
        self._configure(device_pool)
        self.shape = self._read_shape(device_pool)
        self.spec = self._read_spec(device_pool)
        self._page_size = device_pool.page_size
        self._size = self._compute_size(
            device_pool,
            size_argument("host_to_device_ratio", host_to_device_ratio),
            size_argument("host_size_gb", host_size_gb),
        )
        self.pin_memory = self._pin_policy(pin_memory, device_pool.device)
        self._lock = threading.RLock()
        self._allocated = torch.zeros(self._size, dtype=torch.bool)
        self._last_checked: CheckedLoad | None = None
        self._free_slots = torch.arange(self._size, dtype=torch.int64)
        try:
            self._allocate_buffers(device_pool)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"host pool of {self._size} tokens does not fit: {exc}") from None
        self._movers: dict[IOBackend, Mover[DevT]] = {
            io: self._make_mover(factory) for io, factory in type(self).movers[self._layout].items()
        }

    # ----------------------------------------------------------------- hooks
    @abc.abstractmethod
    def _read_shape(self, device_pool: DevT) -> ShapeT:
        """The per-token geometry of ``device_pool`` (called after ``_configure``)."""

    @abc.abstractmethod
    def _read_spec(self, device_pool: DevT) -> KVSpec:
        """The components of ``device_pool``'s rows (called after ``_read_shape``)."""

    @abc.abstractmethod
    def _allocate_buffers(self, device_pool: DevT) -> None:
        """Allocate host tensors for ``self.size`` tokens (pinned if ``self.pin_memory``)."""

    @property
    def host_side(self) -> HostSide:
        """What this pool's movers are built from: its layout, geometry and host buffers."""
        return HostSide(
            self._layout,
            self._size,
            self._page_size,
            self.layer_num,
            getattr(self, "_parts", ()),  # each component's buffer (token-row pools set it)
            self.tuning,
            self.pin_memory,
        )

    def _make_mover(self, factory: Callable[[HostSide], Mover[DevT]]) -> Mover[DevT]:
        """The mover of one io backend, built once the buffers exist (a hook to wrap it)."""
        return factory(self.host_side)

    def _configure(self, device_pool: DevT) -> None:
        """Read what sizing and allocation need from ``device_pool`` (first hook called)."""

    def _pin_policy(self, requested: bool | None, device: torch.device) -> bool:
        """Whether host memory is pinned: ``requested``, else when ``device`` can use it."""
        return should_pin(requested, device)

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        """True when ``io_backend`` on this layout moves whole pages only."""
        return False

    def _check_device_pool_kind(self, device_pool: DevT) -> None:
        """Reject device pools whose storage this host pool cannot address."""

    def _as_device_pool(self, device_pool: DevT) -> DevT:
        """An engine's own device pool (``device`` a ``str``) seen through the protocol."""
        return device_pool

    def _layer_storage(self, device_pool: DevT, layer_id: int) -> Sequence[torch.Tensor]:
        """The device tensors a load of ``layer_id`` writes (re-checked on the memo path)."""
        return ()

    # ---------------------------------------------------------- capabilities
    def synchronize(self) -> None:
        """Wait for every transfer this pool queued; a no-op where transfers are synchronous."""
        for mover in self._movers.values():
            mover.synchronize()

    def layer_views(
        self, device_pool: DevT, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per component: ``(device_rows, host_pages)`` of one layer (see ``LayerViews``)."""
        raise NotImplementedError(f"{type(self).__name__} does not show layer views")

    # ------------------------------------------------------------ properties
    def __repr__(self) -> str:
        return pool_repr(
            self, {"layout": self._layout.value, "device": "cpu", "pin_memory": self.pin_memory}
        )

    @property
    def layout(self) -> HostLayout:
        return self._layout

    @property
    def page_num(self) -> int:
        return self._size // self._page_size

    # ------------------------------------------------------------ the device
    def check_device_pool(self, device_pool: Any) -> None:
        """Raise ``PoolMismatchError`` unless ``device_pool`` matches this pool."""
        names = ("layer_num", *(n for n, _ in self.spec.identity), "dtype", "page_size")
        mine = (self.layer_num, *(v for _, v in self.spec.identity), self.dtype, self._page_size)
        try:
            theirs = tuple(getattr(device_pool, name) for name in names)
        except AttributeError as exc:
            kind = self.spec.kind.value.upper()
            raise PoolMismatchError(f"device_pool is not an {kind} device pool: {exc}") from None
        if mine != theirs:
            raise PoolMismatchError(
                "device_pool does not match the host pool: " + differing_fields(names, theirs, mine)
            )
        self._check_device_pool_kind(device_pool)

    def moves_whole_pages(self, io_backend: IOBackend | str | None = None) -> bool:
        """True when ``io_backend`` (None: the pool's default) takes whole, aligned pages only."""
        io = self._given_io(io_backend)
        return self._is_page_granular(self._check_io_backend(self._layout, io))

    # ------------------------------------------------------------- transfers
    def backup_from_device_all_layer(
        self,
        device_pool: DevT,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend | str | None = None,
    ) -> None:
        """Device -> host, every layer; ``io_backend`` None: the pool's default."""
        device_pool = self._as_device_pool(device_pool)
        transfer = self._check_transfer(
            device_pool, host_indices, device_indices, io_backend, "host_indices"
        )
        if transfer.count:
            self._movers[transfer.io].backup(transfer)

    def load_to_device_per_layer(
        self,
        device_pool: DevT,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: IOBackend | str | None = None,
    ) -> None:
        """Host -> device for one layer; validated once per batch of layers.

        ``io_backend`` None: the ``io_backend`` the pool was created with. A
        later layer's call with the same pool, io backend and unmodified index
        tensor objects re-checks only ``layer_id`` and that layer's device
        storage (docs/design.md section 7; ``sgl_core.kv.host._load_memo``):
        do not modify index tensors behind torch's back between the layers of
        one batch.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        device_pool = self._as_device_pool(device_pool)  # a cached view: same object per layer
        io_backend = self._given_io(io_backend)
        checked = self._last_checked
        fingerprint = self._device_pool_fingerprint(device_pool)
        if (
            checked is None
            or not checked.matches(fingerprint, host_indices, device_indices, io_backend)
            or checked.storage[layer_id] != self._storage_signature(device_pool, layer_id)
        ):
            transfer = self._check_transfer(
                device_pool, host_indices, device_indices, io_backend, "device_indices"
            )
            storage = [self._storage_signature(device_pool, i) for i in range(self.layer_num)]
            checked = CheckedLoad(fingerprint, io_backend, transfer, storage)
            self._last_checked = checked
        if checked.transfer.count:
            self._movers[checked.transfer.io].load(checked.transfer, layer_id)

    def _storage_signature(self, device_pool: DevT, layer_id: int) -> tuple[object, ...]:
        return tuple(tensor_signature(t) for t in self._layer_storage(device_pool, layer_id))

    def _device_pool_fingerprint(self, device_pool: DevT) -> tuple[object, ...]:
        """Objects compared by identity; held (not their ids) so none can be recycled.

        A different pool, or one whose storage was replaced, re-runs validation.
        """
        return (device_pool,)

    def _check_transfer(
        self,
        device_pool: DevT,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend | str | None,
        destination: str,
    ) -> Transfer[DevT]:
        """Every check of a transfer, before any byte moves; the typed result."""
        io = self._check_io_backend(self._layout, self._given_io(io_backend))
        self.check_device_pool(device_pool)
        host_indices, device_indices = check_index_pair(
            host_indices, "host_indices", device_indices, "device_indices"
        )
        check_index_device(host_indices, "host_indices", device_pool.device)
        check_index_device(device_indices, "device_indices", device_pool.device)
        check_index_bounds(host_indices, self._size, "host_indices")
        slots = device_pool.size + device_pool.page_size
        check_index_bounds(device_indices, slots, "device_indices")
        if destination == "host_indices":
            check_unique(host_indices, destination, self._size)
        else:
            check_unique(device_indices, destination, slots)
        if self._is_page_granular(io):
            check_page_runs(host_indices, self._page_size, "host_indices")
            check_page_runs(device_indices, self._page_size, "device_indices")
        self._movers[io].check(device_pool)
        return Transfer(device_pool, host_indices, device_indices, io)
