"""Our host pool as the ``INDEXER`` entry of SGLang 0.5.23's DeepSeek-V3.2 stack.

The entry, its buffers and where it differs from SGLang's
``DSAIndexerPoolHost``: docs/sglang.md. Its builder is in ``_builder``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from sgl_core.errors import (
    ArgumentTypeError,
    IndexDTypeError,
    IndexShapeError,
    PageAlignmentError,
    PoolMismatchError,
)
from sgl_core.integrations.sglang._host import SGLangHostPool
from sgl_core.integrations.sglang._host_pages import SGLangEntryMembers, page_index
from sgl_core.kv._enums import HostLayout
from sgl_core.kv._validation import check_layer_id, check_page_runs
from sgl_core.kv.device._indexer import SCALE_BYTES
from sgl_core.kv.device._paged_indexer import IndexerPagesView
from sgl_core.kv.host._host_kinds import MLAHostPoolBase

__all__ = ["SGLangIndexerHostPool", "indexer_pages", "page_runs"]

_views: weakref.WeakKeyDictionary[Any, IndexerPagesView] = weakref.WeakKeyDictionary()


def indexer_pages(pool: Any) -> IndexerPagesView:
    """The engine pool's cached ``IndexerPagesView`` (one per pool, so load memos match)."""
    view = _views.get(pool)
    if view is None or view.wrapped is not pool:
        view = IndexerPagesView(pool)
        _views[pool] = view
    return view


def page_runs(indices: object, page_size: int, name: str) -> torch.Tensor:
    """The pages of ``indices``: whole, aligned runs of ``page_size`` token indices."""
    if not isinstance(indices, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise IndexDTypeError(f"{name} must be int32 or int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise IndexShapeError(f"{name} must be 1-D, got shape {tuple(indices.shape)}")
    runs = indices.to("cpu", torch.int64)
    check_page_runs(runs, page_size, name)  # the indexer moves whole pages
    return runs[::page_size] // page_size


class SGLangIndexerHostPool(SGLangEntryMembers):
    """One of our host pools of ``IndexerPagesView`` as SGLang's ``DSAIndexerPoolHost``.

    Sizes as SGLang's (``page_size`` and ``size`` in tokens, as the KV
    anchor's); the inner pool (:attr:`pool`) counts pages, one slot each.
    """

    storage_format_tag = None

    def __init__(
        self,
        pool: MLAHostPoolBase,
        device_pool: Any,
        *,
        anchor: SGLangHostPool,
        pool_label: str = "indexer",
    ) -> None:
        if not isinstance(pool, MLAHostPoolBase):
            raise ArgumentTypeError(
                f"the indexer host pool must be an sgl MLA host pool, got {type(pool).__name__}"
            )
        if not isinstance(anchor, SGLangHostPool):
            raise ArgumentTypeError(
                f"anchor must be an SGLangHostPool, got {type(anchor).__name__}"
            )
        view = indexer_pages(device_pool)
        pool.check_device_pool(view)
        if pool.size * view.token_page_size != anchor.size or pool.layout != anchor.layout:
            raise PoolMismatchError(
                f"indexer host pool of {pool.size} pages ({pool.layout}) does not follow the KV "
                f"anchor's {anchor.size} tokens ({anchor.layout})"
            )
        self._bind(pool, pool_label)
        self._base: MLAHostPoolBase = pool
        fmt = view.paged_format
        self.device_pool = device_pool
        self.page_size: int = fmt.page_size
        self.size: int = anchor.size
        self.page_num: int = anchor.page_num
        self.dtype = torch.uint8
        self.indexer_dtype = torch.uint8
        self.end_layer = int(getattr(device_pool, "layer_num", 0)) - 1
        #: The device layers with index pages, in host-layer order.
        self.indexer_layer_ids: tuple[int, ...] = fmt.layer_ids
        self.layer_num: int = len(fmt.layer_ids)
        self.target_layer_num: int = self.layer_num
        self.mtp_draft_device_pools: tuple[Any, ...] = ()
        self.index_head_dim: int = fmt.index_head_dim
        self.indexer_page_stride_size: int = fmt.row_bytes
        self.indexer_layout_dim: int = fmt.row_bytes * self.layer_num
        self.indexer_page_num: int = pool.size
        self.size_per_token: int = (fmt.index_head_dim + SCALE_BYTES) * self.layer_num
        buf = getattr(pool, "kv_buffer", None)
        if not isinstance(buf, torch.Tensor):
            raise PoolMismatchError(f"{type(pool).__name__} keeps no kv_buffer of index pages")
        if self._layout is HostLayout.LAYER_FIRST:
            shape: tuple[int, ...] = (self.layer_num, pool.size, fmt.row_bytes)
            self._page_shape: tuple[int, ...] = (self.layer_num, 1, fmt.row_bytes)
        else:
            shape = (pool.size, self.layer_num, 1, fmt.row_bytes)
            self._page_shape = (1, self.layer_num, 1, fmt.row_bytes)
        #: SGLang's host buffer (a view of the inner pool's, no copy).
        self.index_k_with_scale_buffer: torch.Tensor = buf.view(shape)

    @property
    def pool(self) -> MLAHostPoolBase:
        """The inner host pool (one slot per page)."""
        return self._base

    def get_ksize_per_token(self) -> int:
        return self.size_per_token

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        return [self.index_k_with_scale_buffer]

    def clear(self) -> None:
        """SGLang resets its allocator here; the slots are the KV anchor's, nothing to do."""

    # ---------------------------------------------------------- indices
    def l3_indices(self, host_indices: torch.Tensor) -> torch.Tensor:
        """The inner pool's slots (pages) of SGLang's page-aligned token indices."""
        return page_runs(host_indices, self.page_size, "host_indices")

    def _moves(
        self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor
    ) -> tuple[IndexerPagesView, torch.Tensor, torch.Tensor]:
        if device_pool is not self.device_pool:
            raise PoolMismatchError(
                f"device_pool {type(device_pool).__name__} is not the pool this INDEXER "
                "entry mirrors"
            )
        # Our pool checks the pages themselves (counts, range, duplicates).
        h = page_runs(host_indices, self.page_size, "host_indices")
        d = page_runs(device_indices, self.page_size, "device_indices")
        return indexer_pages(device_pool), h, d

    def _host_layer(self, layer_id: int) -> int | None:
        """The host layer of device layer ``layer_id`` (None: a layer with shared top-k)."""
        layer = check_layer_id(layer_id, self.end_layer + 1)
        if layer not in self.indexer_layer_ids:
            return None  # as SGLang: the layer reuses another's top-k and has no index pages
        return self.indexer_layer_ids.index(layer)

    # ------------------------------------------------------------ pages
    def _page(self, index: object) -> int:
        start = page_index(index)  # our pool checks the page's range
        if start % self.page_size:
            raise PageAlignmentError(f"page start {start} is not a multiple of {self.page_size}")
        return start // self.page_size

    def get_data_page(self, index: object, flat: bool = True) -> torch.Tensor:
        """A copy of one page: every indexer layer's row, in SGLang's shape when not flat."""
        page = self._base.get_data_page(self._page(index), flat)
        return page if flat else page.reshape(self._page_shape)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """One object per page (page-first layouts, as SGLang's); per layer for ``layer_first``."""
        idx = indices if isinstance(indices, torch.Tensor) else torch.tensor(list(indices))
        ptrs, sizes = self._base.get_page_buffer_meta(self.l3_indices(idx))
        return list(ptrs), list(sizes)
