"""Our MLA host pools as SGLang's ``mem_pool_host`` (SGLang 0.5.23).

``wrap_host_pool(pool)`` returns a :class:`SGLangHostPool`: the members that
SGLang's ``HiCacheController``, ``L2TransferEngine``, storage-backend factory
and storage backends read from a host pool, with SGLang's meaning, implemented
on top of any of our host pools (torch, cuda, ascend backends). Pass it where
SGLang expects ``mem_pool_host``. This module imports nothing from ``sglang``.

Semantics kept from SGLang, and the deliberate differences, are listed in
``docs/sglang.md``. In short:

* SGLang passes its own device pool (``device`` a ``str``) to every transfer;
  it is normalized with :func:`sgl_core._foreign_pool.as_device_pool`.
* io ``"kernel"`` on a pool whose layout runs only ``direct`` (the torch
  backend) runs ``direct``: the same rows are moved, with torch copies. This
  is what lets an SGLang ``page_first`` deployment (SGLang runs ``page_first``
  only with ``kernel``) use the torch backend.
* Every transfer is still validated in full by our pool (SGLang does not):
  a bad index raises an ``sgl_core.errors`` exception and changes nothing.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, cast

import torch

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._foreign_pool import as_device_pool
from sgl_core._host_pool import MLAHostPoolBase
from sgl_core._memory import HOST_PAGE_BYTES
from sgl_core._protocols import MLAHostPool
from sgl_core.errors import ArgumentTypeError, PoolMismatchError, UnsupportedLayoutError

__all__ = ["SGLangHostPool", "as_device_pool", "wrap_host_pool"]

# Layouts whose page bytes are SGLang's (same flat-page order and page meta):
# their pages carry no format tag, so they are shared with an SGLang fleet.
_SGLANG_BYTE_COMPATIBLE = frozenset(
    {HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT}
)


def _page_index(index: object) -> int:
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


class SGLangHostPool:
    """One of our host pools, seen as an SGLang ``HostKVCache`` (MLA).

    Attributes SGLang reads as plain values are plain values here; the
    transfer, allocation and L3 calls forward to :attr:`pool` after adapting
    SGLang's arguments (device pool, io backend name, index forms).
    """

    # SGLang HostKVCache class attributes: no decode-context parallelism, no
    # shared compacting layout, no page envelope, no staged write-back kernel.
    dcp_size = 1
    dcp_rank = 0
    shared_allocation_domain = None
    stores_page_envelope = False
    can_use_write_back_jit = False

    def __init__(self, pool: MLAHostPoolBase) -> None:
        if not isinstance(pool, MLAHostPoolBase):
            raise ArgumentTypeError(
                "wrap_host_pool needs a host pool of an sgl backend (an MLAHostPoolBase), "
                f"got {type(pool).__name__}"
            )
        # The base class holds shapes and pairs; the L3 helpers are the protocol's.
        self._base = pool
        self._pool = cast(MLAHostPool, pool)
        layout = HostLayout.parse(pool.layout, argument="layout")
        self._layout = layout
        self._pairs = type(pool).supported_pairs
        self.layout: str = layout.value
        self.size: int = pool.size
        self.page_size: int = pool.page_size
        self.page_num: int = pool.size // pool.page_size
        self.layer_num: int = pool.layer_num
        self.start_layer = 0
        self.end_layer = pool.layer_num - 1
        self.dtype: torch.dtype = pool.dtype
        self.kv_lora_rank: int = pool.shape.kv_lora_rank
        self.qk_rope_head_dim: int = pool.shape.qk_rope_head_dim
        # The row's width (SGLang's host pool takes the device pool's, e.g. 656
        # packed fp8 elements of a DeepSeek-V3.2 pool, not kv_lora_rank + rope).
        self.kv_cache_dim: int = pool.kv_cache_dim
        itemsize = torch.empty((), dtype=pool.dtype).element_size()
        self.token_stride_size: int = self.kv_cache_dim * itemsize
        self.layout_dim: int = self.token_stride_size * self.layer_num
        # Host bytes per token over every layer (SGLang: kv_cache_dim * itemsize * layers).
        self.size_per_token: int = self.layout_dim
        self.pin_memory: bool = bool(getattr(pool, "pin_memory", False))
        self.device = "cpu"  # SGLang's host pools name their own (host) device
        self.kv_buffer: torch.Tensor | None = getattr(pool, "kv_buffer", None)
        # SGLang appends this to the model name in storage keys when a pool's
        # page bytes differ from its own, so such pages miss rather than load.
        self.storage_format_tag: str | None = (
            None if layout in _SGLANG_BYTE_COMPATIBLE else f"sgl-{layout.value}"
        )

    @property
    def pool(self) -> MLAHostPool:
        """The wrapped pool."""
        return self._pool

    # ------------------------------------------------------------- sizes
    @property
    def logical_size(self) -> int:
        return self.size

    @property
    def logical_page_size(self) -> int:
        return self.page_size

    def get_size_per_token(self) -> int:
        return self.size_per_token

    def get_ksize_per_token(self) -> int:
        # MLA has no separate V: SGLang's MLA host pools return the full size.
        return self.size_per_token

    # -------------------------------------------------------- accounting
    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self._pool.alloc(need_size)

    def free(self, indices: torch.Tensor) -> int:
        return self._pool.free(indices)

    def available_size(self) -> int:
        return self._pool.available_size()

    def clear(self) -> None:
        self._pool.clear()

    def destroy(self) -> None:
        """SGLang unregisters pinned buffers here; ours are torch-owned and freed with the pool."""

    # --------------------------------------------------------- transfers
    def _io(self, io_backend: object) -> IOBackend:
        try:
            io = IOBackend.parse(io_backend, argument="io_backend")
        except ValueError as exc:
            raise UnsupportedLayoutError(str(exc)) from None
        ios = self._pairs.get(self._layout, frozenset())
        if io is IOBackend.KERNEL and io not in ios and IOBackend.DIRECT in ios:
            # SGLang's "kernel" (and its index placement) on a pool that has only
            # torch copies: the same rows move, so run them with "direct".
            return IOBackend.DIRECT
        return io

    def prepare_transfer_indices(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As SGLang's plain host pools: the controller already placed the indices.

        Our pools take indices on the CPU or on the device pool's device, which
        covers both of SGLang's placements (``kernel``: host indices moved to
        the device; ``direct``: device indices moved to the CPU).
        """
        return host_indices, device_indices

    def backup_from_device_all_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        self._pool.backup_from_device_all_layer(
            as_device_pool(device_pool), host_indices, device_indices, self._io(io_backend)
        )

    def backup_from_device_all_layer_physical(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        self.backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)

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
        self._pool.load_to_device_per_layer(
            as_device_pool(device_pool),
            host_indices,
            device_indices,
            layer_id,
            self._io(io_backend),
        )

    def load_to_device_per_layer_physical(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: str,
        *,
        is_draft: bool = False,
    ) -> None:
        self.load_to_device_per_layer(
            device_pool, host_indices, device_indices, layer_id, io_backend, is_draft=is_draft
        )

    # ------------------------------------------------------------ L3 pages
    def get_data_page(self, index: object, flat: bool = True) -> torch.Tensor:
        return self._pool.get_data_page(_page_index(index), flat)

    def set_from_flat_data_page(self, index: object, data_page: torch.Tensor) -> None:
        self._pool.set_from_flat_data_page(_page_index(index), data_page)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return self._pool.get_dummy_flat_data_page()

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        return self._pool.get_page_buffer_meta(indices)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        return self._pool.get_contiguous_buf_infos()

    def get_page_buffer_element_size(self, split_factor: int = 1) -> int:
        """Bytes of the first storage object of a page (SGLang's storage element)."""
        if split_factor != 1:
            raise UnsupportedLayoutError(
                f"split_factor={split_factor}: MLA pages have no heads to split"
            )
        _, sizes = self._pool.get_page_buffer_meta(list(range(self.page_size)))
        return int(sizes[0])

    def is_stride_page_aligned(self, page_size_bytes: int = HOST_PAGE_BYTES) -> bool:
        """True when every storage object of every page starts ``page_size_bytes``-aligned.

        Each object's address is ``base + page * stride`` (one base and stride
        per object of a page, as every layout here lays pages out evenly), so
        the first page's addresses and the step to the second page decide all
        pages. Unlike SGLang (which answers False for ``layer_first``), this
        holds for every layout: ``layer_first`` objects are aligned when the
        buffer, a layer's slab and a page's rows all are.
        """
        if isinstance(page_size_bytes, bool) or not isinstance(page_size_bytes, int):
            raise ArgumentTypeError("page_size_bytes must be an int")
        if page_size_bytes <= 0:
            raise ArgumentTypeError(f"page_size_bytes must be positive, got {page_size_bytes}")
        ps = self.page_size
        first, _ = self._pool.get_page_buffer_meta(list(range(ps)))
        if any(ptr % page_size_bytes for ptr in first):
            return False
        if self.page_num < 2:
            return True
        second, _ = self._pool.get_page_buffer_meta(list(range(ps, 2 * ps)))
        return all((b - a) % page_size_bytes == 0 for a, b in zip(first, second, strict=True))


def wrap_host_pool(pool: MLAHostPoolBase) -> SGLangHostPool:
    """``pool`` as an SGLang ``mem_pool_host`` (see the module docstring)."""
    return SGLangHostPool(pool)
