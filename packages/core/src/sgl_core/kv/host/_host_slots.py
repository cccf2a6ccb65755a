"""Slot accounting and the L3 page methods of a host pool (a base of ``HostPoolBase``).

``alloc`` hands out whole pages from a free list and ``free`` takes them back,
rejecting double frees, partial pages and out-of-range slots with
``FreeError``; everything under one lock, so threads may share a pool. The
page helpers check the arguments of the L3 page methods.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence

import torch

from sgl_core.errors import (
    ArgumentTypeError,
    FreeError,
    IndexOutOfRangeError,
    PageAlignmentError,
    PoolSizeError,
)
from sgl_core.kv._spec import KVKind, KVSpec
from sgl_core.kv._validation import (
    check_index_bounds,
    check_index_tensor,
    check_page_runs,
)
from sgl_core.kv.device._slot_geometry import PoolSizes

__all__ = ["HostSlots"]


class HostSlots(PoolSizes):
    """Accounting of ``_size`` token slots in pages of ``_page_size``."""

    _lock: threading.RLock
    _allocated: torch.Tensor
    _free_slots: torch.Tensor

    #: The device pool's rows as components: sizes, page order and format identity.
    spec: KVSpec

    def page_format_fields(self) -> dict[str, object]:
        """What an L3 page's bytes mean beyond what ``sgl_core.l3`` reads off the pool.

        MLA pages are named by the pool's own attributes (ranks, row width,
        indexer buffers); MHA pages by the kind and its heads and head dims.
        """
        if self.spec.kind is KVKind.MLA:
            return {}
        return {"kv_kind": self.spec.kind.value, **dict(self.spec.identity)}

    # ------------------------------------------- L3 page helpers (per layout)
    @abc.abstractmethod
    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of the page starting at token ``index`` (flat: components in spec order)."""

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
        """Addresses and sizes of each page's memory objects, components in spec order."""

    @abc.abstractmethod
    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(base_ptrs, total_bytes, object_bytes)`` of each host buffer."""

    # ------------------------------------------------------------ accounting
    def available_size(self) -> int:
        with self._lock:
            return int(self._free_slots.numel())

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if isinstance(need_size, bool) or not isinstance(need_size, int) or need_size < 0:
            raise PoolSizeError(f"need_size must be a non-negative int, got {need_size!r}")
        if need_size % self._page_size:
            raise PageAlignmentError(
                f"need_size={need_size} is not a multiple of page_size={self._page_size}"
            )
        with self._lock:
            if need_size > self._free_slots.numel():
                return None
            taken = self._free_slots[:need_size].clone()
            self._free_slots = self._free_slots[need_size:]
            self._allocated[taken] = True
            return taken

    def free(self, indices: torch.Tensor) -> int:
        indices = check_index_tensor(indices, "indices").to("cpu")
        with self._lock:
            try:
                check_index_bounds(indices, self._size, "indices")
            except IndexOutOfRangeError as exc:
                raise FreeError(str(exc)) from None
            if torch.unique(indices).numel() != indices.numel():
                raise FreeError("indices frees the same slot twice")
            try:
                check_page_runs(indices, self._page_size, "indices")
            except PageAlignmentError as exc:
                # alloc hands out whole pages; a partial page back would misalign later allocs
                raise FreeError(str(exc)) from None
            if indices.numel() and not bool(self._allocated[indices].all()):
                bad = int(indices[~self._allocated[indices]][0])
                raise FreeError(f"indices holds slot {bad}, which is not allocated (double free?)")
            self._allocated[indices] = False
            self._free_slots = torch.cat([self._free_slots, indices])
            return int(indices.numel())

    def clear(self) -> None:
        with self._lock:
            self._allocated.zero_()
            self._free_slots = torch.arange(self._size, dtype=torch.int64)

    # -------------------------------------------------------------- L3 pages
    def _check_page_start(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int):
            raise ArgumentTypeError(f"index must be an int, got {type(index).__name__}")
        if not 0 <= index < self._size:
            raise IndexOutOfRangeError(f"index={index} is outside [0, {self._size})")
        if index % self._page_size:
            raise PageAlignmentError(
                f"index={index} is not a page start (page_size={self._page_size})"
            )
        return index
