"""``MHAHostPoolBase``: the MHA host-pool base (sizing, accounting, validation, dispatch).

Everything but the geometry is ``HostPoolBase``'s, shared with MLA: the
constructor checks, slot accounting, validation of every transfer into a
``Transfer[MHADevicePool]`` before any byte moves, the per-layer load memo
and the dispatch to the io backend's mover. This class adds the MHA shape
(``head_num``, ``head_dim``, ``v_head_dim``) and its device-pool check.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._host_pool import HostPoolBase
from sgl_core._mha_foreign_pool import as_mha_device_pool
from sgl_core._mha_protocols import MHADevicePool
from sgl_core._mha_shapes import MHAShape
from sgl_core._transfer import MHAMoverFactory
from sgl_core._validation import differing_fields
from sgl_core.errors import PoolMismatchError

__all__ = ["MHAHostPoolBase"]

_FIELDS = ("layer_num", "head_num", "head_dim", "v_head_dim", "dtype", "page_size")


class MHAHostPoolBase(HostPoolBase[MHADevicePool, MHAShape]):
    """Common behaviour of MHA host pools (see ``sgl_core.MHAHostPool``)."""

    #: Per host layout this class builds: each io backend it runs and its mover factory.
    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MHAMoverFactory]]]

    def _as_device_pool(self, device_pool: MHADevicePool) -> MHADevicePool:
        # The same view create_host_pool made: SGLang's pool moves its own bytes.
        return as_mha_device_pool(device_pool)

    def _read_shape(self, device_pool: MHADevicePool) -> MHAShape:
        try:
            return MHAShape(
                device_pool.layer_num,
                device_pool.head_num,
                device_pool.head_dim,
                device_pool.v_head_dim,
                device_pool.dtype,
            )
        except AttributeError as exc:
            raise PoolMismatchError(f"device_pool is not an MHA device pool: {exc}") from None

    @property
    def head_num(self) -> int:
        return self.shape.head_num

    @property
    def head_dim(self) -> int:
        return self.shape.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.shape.v_head_dim

    # ------------------------------------------- L3 page helpers (per layout)
    @abc.abstractmethod
    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of the page starting at token ``index`` (flat: K then V, layout order)."""

    @abc.abstractmethod
    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        """Write a flat page (as ``get_data_page`` returns it) at token ``index``."""

    @abc.abstractmethod
    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """A zeroed flat page."""

    @abc.abstractmethod
    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """Addresses and sizes of each page's objects: K objects, then V objects."""

    @abc.abstractmethod
    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(base_ptrs, total_bytes, object_bytes)`` of each host buffer."""

    def page_format_fields(self) -> dict[str, object]:
        """What an L3 page's bytes mean beyond layout, dtype, page size and layers."""
        return {
            "kv_kind": "mha",
            "head_num": self.head_num,
            "head_dim": self.head_dim,
            "v_head_dim": self.v_head_dim,
        }

    def check_device_pool(self, device_pool: MHADevicePool) -> None:
        """Raise ``PoolMismatchError`` unless ``device_pool`` matches this pool."""
        mine = (
            self.layer_num,
            self.head_num,
            self.head_dim,
            self.v_head_dim,
            self.dtype,
            self._page_size,
        )
        try:
            theirs = tuple(getattr(device_pool, name) for name in _FIELDS)
        except AttributeError as exc:
            raise PoolMismatchError(f"device_pool is not an MHA device pool: {exc}") from None
        if mine != theirs:
            raise PoolMismatchError(
                "device_pool does not match the host pool: "
                + differing_fields(_FIELDS, theirs, mine)
            )
        self._check_device_pool_kind(device_pool)
