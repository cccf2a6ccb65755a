"""Structural contracts of the KV pools, one for every kind (docs/design.md sections 5, 6).

Backend authors implement these Protocols (no inheritance needed) and add a
static conformance line (``if TYPE_CHECKING: _pool: MLAHostPool = ...``).
Slots, the padding page and ``loc`` are as docs/design.md section 5a says;
the kinds differ only in their rows and accessors (``sgl_core.kv._spec``). A
device pool is MHA when it reports ``head_num`` and no ``kv_lora_rank``
(:func:`is_mha_device_pool`), so SGLang's pools dispatch by attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar, Union, runtime_checkable

import torch
from typing_extensions import NotRequired, TypedDict

from sgl_core.kv._enums import HostLayout, IOBackend

__all__ = [
    "DevicePoolGeometry",
    "HostPoolOptions",
    "KVHostPool",
    "MHADevicePool",
    "MHAGeometryArgs",
    "MHAHostPool",
    "MHAPoolArgs",
    "MLADevicePool",
    "MLAGeometryArgs",
    "MLAHostPool",
    "MLAPoolArgs",
    "PoolShape",
    "is_mha_device_pool",
]


class _GeometryArgs(TypedDict):
    size: int
    page_size: int
    dtype: torch.dtype
    layer_num: int


class MLAGeometryArgs(_GeometryArgs):
    """The keyword arguments of an MLA pool's geometry (``MLAPoolGeometry``)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    kv_cache_dim: NotRequired[int | None]


class MLAPoolArgs(MLAGeometryArgs):
    """The keyword arguments of an MLA (or DSA) device pool (``Backend.create_device_pool``)."""

    device: NotRequired[str | torch.device | None]
    index_head_dim: NotRequired[int | None]
    indexer_layer_ids: NotRequired[Iterable[int] | None]
    with_index_k_scale: NotRequired[bool]


class MHAGeometryArgs(_GeometryArgs):
    """The keyword arguments of an MHA pool's geometry (``MHAPoolGeometry``)."""

    head_num: int
    head_dim: int
    v_head_dim: NotRequired[int | None]


class MHAPoolArgs(MHAGeometryArgs):
    """The keyword arguments of an MHA/GQA device pool (``Backend.create_mha_device_pool``)."""

    device: NotRequired[str | torch.device | None]


class HostPoolOptions(TypedDict):
    """The keyword arguments of ``Backend.create_host_pool`` after the device pool."""

    layout: HostLayout | str
    host_to_device_ratio: NotRequired[float]
    host_size_gb: NotRequired[float]
    pin_memory: NotRequired[bool | None]
    io_backend: NotRequired[IOBackend | str | None]


class _PoolSizes(Protocol):
    """What a device pool and a host pool both report."""

    @property
    def size(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def layer_num(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...


@runtime_checkable
class DevicePoolGeometry(_PoolSizes, Protocol):
    """Token slots ``[0, size + page_size)`` in pages of ``page_size``, on one device."""

    @property
    def device(self) -> torch.device: ...


@runtime_checkable
class MLADevicePool(DevicePoolGeometry, Protocol):
    """An accelerator-side MLA KV cache: one ``kv_cache_dim`` row per token per layer."""

    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...
    @property
    def kv_cache_dim(self) -> int: ...

    def set_mla_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        """Write ``(n, 1, kv_lora_rank)`` and ``(n, 1, qk_rope_head_dim)`` rows at ``loc``."""
        ...

    def get_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return copies of the ``(k_nope, k_rope)`` rows at ``loc``."""
        ...


class _MHADims(Protocol):
    @property
    def head_num(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def v_head_dim(self) -> int: ...


@runtime_checkable
class MHADevicePool(DevicePoolGeometry, _MHADims, Protocol):
    """An accelerator-side MHA/GQA KV cache: a K and a V row per token per layer
    (GQA: ``head_num`` is the number of KV heads on this rank)."""

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None:
        """Write K rows ``(n, head_num, head_dim)`` and V rows ``(n, head_num, v_head_dim)``."""
        ...

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return copies of the ``(k, v)`` rows at ``loc``."""
        ...


DevT_contra = TypeVar("DevT_contra", contravariant=True)


@runtime_checkable
class _HostPool(_PoolSizes, Protocol[DevT_contra]):
    """A host-memory backup of KV pages (HiCache L2) of device pools ``DevT_contra``.

    Host token indices are ``[0, size)``; ``size`` is whole pages. Transfers
    validate every argument first: a rejected call raises a
    ``sgl_core.errors`` exception and changes no byte of either pool.
    Transfers may return once queued on an accelerator stream: call
    ``synchronize()`` before reading host bytes another way than through the
    pool (its own page helpers wait by themselves).
    """

    @property
    def layout(self) -> HostLayout: ...

    def backup_from_device_all_layer(
        self,
        device_pool: DevT_contra,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend | str,
    ) -> None:
        """Copy every layer of ``device_indices`` rows to ``host_indices`` rows."""
        ...

    def load_to_device_per_layer(
        self,
        device_pool: DevT_contra,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: IOBackend | str,
    ) -> None:
        """Copy layer ``layer_id`` of ``host_indices`` rows back to the device."""
        ...

    def synchronize(self) -> None:
        """Wait until every transfer this pool queued has finished (no-op when synchronous)."""
        ...

    def moves_whole_pages(self, io_backend: IOBackend | str) -> bool:
        """True when ``io_backend`` on this pool's layout takes whole, aligned pages only."""
        ...

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """Reserve ``need_size`` slots (whole pages); ``None`` when not enough are free."""
        ...

    def free(self, indices: torch.Tensor) -> int:
        """Release slots; freeing a free or out-of-range slot raises ``FreeError``."""
        ...

    def available_size(self) -> int: ...
    def clear(self) -> None:
        """Mark every slot free (contents are left as they are)."""
        ...

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of the page starting at token ``index`` (flat: 1-D, the components in
        order, each in the layout's byte order)."""
        ...

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        """Write a flat page (as returned by ``get_data_page``) at token ``index``."""
        ...

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        """A zeroed flat page of the right dtype and length."""
        ...

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """Addresses and byte sizes of the memory objects of whole pages.

        ``indices`` are token indices of whole, aligned pages. The objects of
        one page, concatenated in order, are exactly ``get_data_page(start)``.
        """
        ...

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(base_ptrs, total_bytes, object_bytes)`` of each host buffer, for registration."""
        ...


@runtime_checkable
class MLAHostPool(_HostPool[MLADevicePool], Protocol):
    """A host pool of MLA device pools (see docs/design.md section 6)."""


@runtime_checkable
class MHAHostPool(_HostPool[MHADevicePool], _MHADims, Protocol):
    """A host pool of MHA/GQA device pools: the same contract, with the kind's numbers."""


#: A host pool of either kind: what L3 page stores accept (they read only the
#: members both kinds share: layout, sizes, dtype and the L3 page helpers).
KVHostPool = Union[MLAHostPool, MHAHostPool]  # noqa: UP007  (a runtime alias on 3.10)


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
