"""Our host pools (MLA and MHA/GQA) as SGLang 0.5.23's ``HostKVCache``.

The members SGLang reads, their page bytes and order, and where we differ:
docs/sglang.md. Every transfer is still validated in full by our pool (SGLang
does not): a bad index raises an ``sgl_core.errors`` exception and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from sgl_core.errors import ArgumentTypeError
from sgl_core.integrations.sglang._host_pages import SGLangEntryMembers
from sgl_core.kv._enums import HostLayout
from sgl_core.kv.device._foreign_pool import ForeignMLADevicePool
from sgl_core.kv.device._paged_indexer import ForeignPagedIndexerPool, IndexerPagesView
from sgl_core.kv.host._host_kinds import MHAHostPoolBase, MLAHostPoolBase
from sgl_core.kv.protocols._kv_protocols import MHAHostPool, MLAHostPool

__all__ = ["SGLangHostPool", "wrap_host_pool"]

# Layouts whose page bytes are SGLang's (same flat-page order and page meta):
# their pages carry no format tag, so they are shared with an SGLang fleet.
_MLA_BYTE_COMPATIBLE = frozenset(
    {HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST, HostLayout.PAGE_FIRST_DIRECT}
)
# SGLang's MHATokenToKVPoolHost (K and V in one (2, ...) buffer, equal head dims).
_MHA_BYTE_COMPATIBLE = _MLA_BYTE_COMPATIBLE | {HostLayout.PAGE_HEAD}


class SGLangHostPool(SGLangEntryMembers):
    """One of our host pools, seen as an SGLang ``HostKVCache`` (MLA or MHA/GQA).

    Attributes SGLang reads as plain values are plain values here; the
    transfer, allocation and L3 calls forward to :attr:`pool` after adapting
    SGLang's arguments (device pool, io backend name, index forms).
    """

    def __init__(
        self,
        pool: MLAHostPoolBase | MHAHostPoolBase,
        *,
        pool_label: str = "kv",
        kv_rows: ForeignMLADevicePool | None = None,
    ) -> None:
        if not isinstance(pool, (MLAHostPoolBase, MHAHostPoolBase)):
            raise ArgumentTypeError(
                "wrap_host_pool needs a host pool of an sgl backend (an MLAHostPoolBase or "
                f"MHAHostPoolBase), got {type(pool).__name__}"
            )
        if getattr(pool, "indexer_layer_ids", ()):
            # SGLang moves a DSA indexer as its own INDEXER host pool: a KV entry
            # whose pages also carry it has other sizes and storage objects.
            raise ArgumentTypeError(
                "wrap_host_pool takes host pools without an indexer cache (SGLang keeps "
                "DeepSeek-V3.2's indexer as its own INDEXER host pool, not wrapped here)"
            )
        if not isinstance(pool_label, str) or not pool_label:
            raise ArgumentTypeError("pool_label must be a non-empty str")
        if kv_rows is not None:
            if not isinstance(kv_rows, ForeignMLADevicePool) or isinstance(
                kv_rows, (ForeignPagedIndexerPool, IndexerPagesView)
            ):
                raise ArgumentTypeError("kv_rows must be a plain ForeignMLADevicePool view")
            pool.check_device_pool(kv_rows)
        #: SGLang's DSA stack: the engine pool whose KV rows alone this pool mirrors
        #: (its indexer is the INDEXER entry's), and the view that shows only them.
        self._kv_rows = kv_rows
        self._bind(pool, pool_label)
        layout = self._layout
        self.size: int = pool.size
        self.page_size: int = pool.page_size
        self.page_num: int = pool.size // pool.page_size
        self.layer_num: int = pool.layer_num
        self.end_layer = pool.layer_num - 1
        self.dtype: torch.dtype = pool.dtype
        itemsize = pool.dtype.itemsize
        self.kv_buffer: torch.Tensor | None = getattr(pool, "kv_buffer", None)
        if isinstance(pool, MHAHostPoolBase):
            self.head_num: int = pool.head_num
            self.head_dim: int = pool.head_dim
            self.v_head_dim: int = pool.v_head_dim
            self.k_buffer: torch.Tensor | None = getattr(pool, "k_buffer", None)
            self.v_buffer: torch.Tensor | None = getattr(pool, "v_buffer", None)
            # SGLang: one K row of a token and layer; layout_dim spans the layers.
            self.token_stride_size: int = self.head_num * self.head_dim * itemsize
            self._k_bytes = self.token_stride_size * self.layer_num
            self.size_per_token: int = (
                (self.head_dim + self.v_head_dim) * self.head_num * self.layer_num * itemsize
            )
            compatible = layout in _MHA_BYTE_COMPATIBLE and self.head_dim == self.v_head_dim
        else:
            self.kv_lora_rank: int = pool.shape.kv_lora_rank
            self.qk_rope_head_dim: int = pool.shape.qk_rope_head_dim
            # The row's width (SGLang's host pool takes the device pool's, e.g. 656
            # packed fp8 elements of a DeepSeek-V3.2 pool, not kv_lora_rank + rope).
            self.kv_cache_dim: int = pool.kv_cache_dim
            self.token_stride_size = self.kv_cache_dim * itemsize
            self.size_per_token = self.token_stride_size * self.layer_num
            self._k_bytes = self.size_per_token  # MLA: no separate V
            compatible = layout in _MLA_BYTE_COMPATIBLE
        self.layout_dim: int = self.token_stride_size * self.layer_num
        # SGLang appends this to the model name in storage keys when a pool's
        # page bytes differ from its own, so such pages miss rather than load.
        self.storage_format_tag: str | None = None if compatible else f"sgl-{layout.value}"

    @property
    def pool(self) -> MLAHostPool | MHAHostPool:
        """The wrapped pool."""
        return cast("MLAHostPool | MHAHostPool", self._base)

    @property
    def is_mha(self) -> bool:
        """True for an MHA/GQA pool (K and V rows), False for MLA."""
        return isinstance(self._base, MHAHostPoolBase)

    # ------------------------------------------------------------- sizes
    def get_ksize_per_token(self) -> int:
        """K bytes of a token over every layer (MLA: all of it, there is no V)."""
        return self._k_bytes

    # -------------------------------------------------------- accounting
    def alloc(self, need_size: int) -> torch.Tensor | None:
        return self.pool.alloc(need_size)

    def free(self, indices: torch.Tensor) -> int:
        return self.pool.free(indices)

    def available_size(self) -> int:
        return self.pool.available_size()

    def clear(self) -> None:
        self.pool.clear()

    # --------------------------------------------------------- transfers
    def _moves(
        self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The KV-rows view for the DSA pool of an SGLang KV entry; any other pool as given
        (our pools see SGLang's raw device pool through their cached views)."""
        rows = self._kv_rows
        if rows is not None and device_pool is rows.wrapped:
            device_pool = rows
        return device_pool, host_indices, device_indices

    def l3_indices(self, host_indices: torch.Tensor) -> torch.Tensor:
        """The wrapped pool's slots of SGLang's host indices (the same token slots)."""
        return host_indices

    # ------------------------------------------------------------ L3 pages
    def get_data_page(self, index: object, flat: bool = True) -> torch.Tensor:
        return self.pool.get_data_page(self._page(index), flat)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        ptrs, sizes = self.pool.get_page_buffer_meta(indices)
        ptrs, sizes = list(ptrs), list(sizes)
        if self.is_mha and self._layout is HostLayout.LAYER_FIRST:
            # Ours, per page: K of every layer, then V of every layer. SGLang's:
            # K and V of layer 0, then of layer 1, ... (same objects, reordered).
            n = self.layer_num
            order = [p * 2 * n + part * n + layer
                     for p in range(len(ptrs) // (2 * n))
                     for layer in range(n) for part in (0, 1)]  # fmt: skip
            ptrs = [ptrs[i] for i in order]
            sizes = [sizes[i] for i in order]
        return ptrs, sizes

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        return self.pool.get_contiguous_buf_infos()


def wrap_host_pool(
    pool: MLAHostPoolBase | MHAHostPoolBase, *, pool_label: str = "kv"
) -> SGLangHostPool:
    """``pool`` (MLA or MHA/GQA) as an SGLang ``mem_pool_host`` / ``HostPoolGroup`` entry."""
    return SGLangHostPool(pool, pool_label=pool_label)
