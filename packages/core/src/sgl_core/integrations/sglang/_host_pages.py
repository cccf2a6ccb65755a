"""What SGLang 0.5.23's ``HostPoolGroup`` entries of ours share: the members
both spell alike (:class:`SGLangEntryMembers`) and :func:`page_index`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from sgl_core.errors import ArgumentTypeError, PoolMismatchError, UnsupportedLayoutError
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._memory import HOST_PAGE_BYTES

__all__ = ["SGLangEntryMembers", "page_index"]


def page_index(index: object) -> int:
    """SGLang passes page starts as ints or as 0-d index tensors (``host_indices[i]``)."""
    if isinstance(index, torch.Tensor):
        if index.numel() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ArgumentTypeError(
                f"index must be one integer, got a tensor of shape {tuple(index.shape)} "
                f"and dtype {index.dtype}"
            )
        return int(index.item())
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        raise ArgumentTypeError(f"index must be an int, got {type(index).__name__}")
    return int(index)


class SGLangEntryMembers:
    """Mixin: the members every ``HostPoolGroup`` entry of ours spells alike.

    SGLang's controller and L2 engine read token sizes (``logical_*``) and
    call the ``*_physical`` transfers, which for our pools are the plain ones
    (our pools keep no separate physical index space).
    """

    # SGLang HostKVCache class attributes: no decode-context parallelism, no
    # shared compacting layout, no page envelope, no staged write-back kernel.
    dcp_size = 1
    dcp_rank = 0
    shared_allocation_domain = None
    stores_page_envelope = False
    can_use_write_back_jit = False

    if TYPE_CHECKING:
        size: int
        page_size: int
        page_num: int
        size_per_token: int

        def get_page_buffer_meta(
            self, indices: torch.Tensor | Sequence[int]
        ) -> tuple[list[int], list[int]]: ...

        def _moves(
            self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor
        ) -> tuple[Any, torch.Tensor, torch.Tensor]:
            """The wrapped pool's device pool, host and device indices of SGLang's."""

    @property
    def logical_size(self) -> int:
        return self.size

    @property
    def logical_page_size(self) -> int:
        return self.page_size

    def get_size_per_token(self) -> int:
        return self.size_per_token

    def _bind(self, pool: Any, pool_label: str) -> None:
        """The members both entries read off the wrapped pool in the same way."""
        self._base = pool
        self._layout = HostLayout.parse(pool.layout, argument="layout")
        self._pairs: Mapping[HostLayout, frozenset[IOBackend]] = type(pool).supported_pairs
        #: SGLang's label for the pool in logs and shared-domain requests.
        self.pool_label = pool_label
        self.layout: str = self._layout.value
        self.device = "cpu"  # SGLang's host pools name their own (host) device
        self.pin_memory: bool = bool(getattr(pool, "pin_memory", False))
        self.start_layer = 0

    def _io(self, io_backend: object) -> IOBackend:
        """SGLang's io backend name for this pool; ``"kernel"`` on a layout that runs
        only ``direct`` (the torch backend) runs ``direct``: the same rows move."""
        try:
            io = IOBackend.parse(io_backend, argument="io_backend")
        except ValueError as exc:
            raise UnsupportedLayoutError(str(exc)) from None
        ios = self._pairs.get(self._layout, frozenset())
        if io is IOBackend.KERNEL and io not in ios and IOBackend.DIRECT in ios:
            return IOBackend.DIRECT
        return io

    def destroy(self) -> None:
        """SGLang unregisters pinned buffers here; ours are torch-owned and freed with the pool."""

    def _page(self, index: object) -> int:
        """The wrapped pool's page of SGLang's page start ``index``."""
        return page_index(index)

    def set_from_flat_data_page(self, index: object, data_page: torch.Tensor) -> None:
        self._base.set_from_flat_data_page(self._page(index), data_page)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        page: torch.Tensor = self._base.get_dummy_flat_data_page()
        return page

    def _page_meta(self, page: int) -> tuple[list[int], list[int]]:
        ps = self.page_size
        return self.get_page_buffer_meta(list(range(page * ps, (page + 1) * ps)))

    def get_page_buffer_element_size(self, split_factor: int = 1) -> int:
        """Bytes of the first storage object of a page (SGLang's storage element)."""
        if split_factor != 1:
            raise UnsupportedLayoutError(
                f"split_factor={split_factor}: heads are not split across storage objects here"
            )
        return int(self._page_meta(0)[1][0])

    def is_stride_page_aligned(self, page_size_bytes: int = HOST_PAGE_BYTES) -> bool:
        """True when every storage object of every page starts ``page_size_bytes``-aligned.

        Each object's address is ``base + page * stride`` (every layout lays
        pages out evenly), so pages 0 and 1 decide all (docs/sglang.md).
        """
        if isinstance(page_size_bytes, bool) or not isinstance(page_size_bytes, int):
            raise ArgumentTypeError("page_size_bytes must be an int")
        if page_size_bytes <= 0:
            raise ArgumentTypeError(f"page_size_bytes must be positive, got {page_size_bytes}")
        first = self._page_meta(0)[0]
        if any(ptr % page_size_bytes for ptr in first):
            return False
        if self.page_num < 2:
            return True
        second = self._page_meta(1)[0]
        return all((b - a) % page_size_bytes == 0 for a, b in zip(first, second, strict=True))

    def prepare_transfer_indices(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As SGLang's plain host pools: the controller already placed the indices.

        Our pools take indices on the CPU or on the device pool's device, which
        covers both of SGLang's placements (``kernel``: host indices moved to
        the device; ``direct``: device indices moved to the CPU).
        """
        return host_indices, device_indices

    # ------------------------------------------------------------ transfers
    def _host_layer(self, layer_id: int) -> int | None:
        """The wrapped pool's layer of SGLang's device ``layer_id`` (None: nothing to load)."""
        return layer_id

    def backup_from_device_all_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        io = self._io(io_backend)
        self._base.backup_from_device_all_layer(
            *self._moves(device_pool, host_indices, device_indices), io
        )

    def load_to_device_per_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
        *,
        is_draft: bool = False,
    ) -> None:
        if is_draft:
            # SGLang packs speculative-draft layers after the target layers of
            # its own host pools; ours hold target layers only.
            raise PoolMismatchError(
                "is_draft=True: this host pool holds no packed draft layers "
                "(give the draft model its own host pool)"
            )
        io = self._io(io_backend)
        layer = self._host_layer(layer_id)
        moves = self._moves(device_pool, host_indices, device_indices)
        if layer is not None:
            self._base.load_to_device_per_layer(*moves, layer, io)

    backup_from_device_all_layer_physical = backup_from_device_all_layer
    load_to_device_per_layer_physical = load_to_device_per_layer
