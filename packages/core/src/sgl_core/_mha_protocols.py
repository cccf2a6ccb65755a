"""Structural contracts of the MHA/GQA KV cache (docs/design.md section 5b).

Most models keep, per layer, a K and a V tensor of ``(tokens, head_num,
head_dim)`` (GQA: ``head_num`` is the number of KV heads on this rank; V may
have its own ``v_head_dim``). These protocols are the MHA siblings of
``MLADevicePool`` / ``MLAHostPool``: the same slots, accounting, transfers and
L3 page helpers, with K and V rows instead of one latent row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from sgl_core._enums import HostLayout, IOBackend

__all__ = ["MHADevicePool", "MHAHostPool"]


@runtime_checkable
class MHADevicePool(Protocol):
    """An accelerator-side MHA/GQA KV cache: a K and a V row per token per layer.

    Token slots are ``[0, size + page_size)``: pages ``1 .. size // page_size``
    plus the padding page, page 0, as for MLA. ``loc`` arguments are 1-D ``torch.int64`` token
    indices. K rows are ``(head_num, head_dim)``, V rows
    ``(head_num, v_head_dim)``.
    """

    @property
    def size(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def layer_num(self) -> int: ...
    @property
    def head_num(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def v_head_dim(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def device(self) -> torch.device: ...

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


@runtime_checkable
class MHAHostPool(Protocol):
    """A host-memory backup of MHA KV pages (HiCache L2), see docs/design.md section 5b.

    The same contract as ``MLAHostPool``: host token indices ``[0, size)``,
    every argument validated before any byte moves (a rejected call raises a
    ``sgl_core.errors`` exception and changes no byte of either pool), and
    ``synchronize()`` before reading host bytes another way than through the
    pool. A flat page holds the page's K bytes, then its V bytes.
    """

    @property
    def layout(self) -> HostLayout: ...
    @property
    def size(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def layer_num(self) -> int: ...
    @property
    def head_num(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def v_head_dim(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...

    def backup_from_device_all_layer(
        self,
        device_pool: MHADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend | str,
    ) -> None:
        """Copy K and V of every layer of ``device_indices`` rows to ``host_indices`` rows."""
        ...

    def load_to_device_per_layer(
        self,
        device_pool: MHADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: IOBackend | str,
    ) -> None:
        """Copy K and V of layer ``layer_id`` of ``host_indices`` rows back to the device."""
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
        """A copy of the page starting at token ``index`` (flat: 1-D, K then V, layout order)."""
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
        """Addresses and byte sizes of the memory objects of whole pages (K objects, then V).

        The objects of one page, concatenated in order, are exactly
        ``get_data_page(start)``.
        """
        ...

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(base_ptrs, total_bytes, object_bytes)`` of each host buffer (K, then V)."""
        ...
