"""Our host pool as the ``INDEXER`` entry of SGLang 0.5.23's DeepSeek-V3.2 stack.

SGLang's ``_DsaStrategy`` builds a ``HostPoolGroup`` from the declarations of
its ``DSATokenToKVPool``: the KV root (``build_kv_host_pool``) and an
``INDEXER`` entry that ``make_dsa_indexer_pool_decl``'s ``host_pool_builder``
(SGLang's ``DSAIndexerHostPoolBuilder``) builds anchored on the KV host pool.
That entry copies whole index pages: per page and indexer layer one ``uint8``
row of ``page_size`` keys then ``page_size`` float32 scales.

:class:`SGLangIndexerHostPool` is that entry on one of our host pools: the
pool is built over ``IndexerPagesView`` (the engine's index pages as an MLA
device pool of one slot per page), so its buffer is SGLang's
``index_k_with_scale_buffer`` byte for byte (``(pages, layers, 1, row)`` for
``page_first``/``page_first_direct``, ``(layers, pages, row)`` for
``layer_first``) and its moves are our movers (torch, cuda kernel or direct).
SGLang's token indices (page-aligned runs, indices shared with the KV entry)
are checked in full, then turned into page indices, before any byte moves.

:func:`indexer_host_pool_builder` replaces SGLang's builder. SGLang has no
option for it (as for ``build_kv_host_pool``); ``make_dsa_indexer_pool_decl``
calls ``DSAIndexerHostPoolBuilder()`` when the stack is built, so a deployment
replaces that name with our builder (calling it returns itself)::

    from sglang.srt.mem_cache.pool_host import dsa
    dsa.DSAIndexerHostPoolBuilder = indexer_host_pool_builder(backend)
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
    LayerIndexError,
    PageAlignmentError,
    PoolMismatchError,
    UnsupportedLayoutError,
)
from sgl_core.integrations.sglang._host import SGLangHostPool, sglang_io
from sgl_core.integrations.sglang._host_pages import page_index
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._memory import HOST_PAGE_BYTES
from sgl_core.kv.device._indexer import SCALE_BYTES
from sgl_core.kv.device._paged_indexer import IndexerPagesView, has_paged_indexer
from sgl_core.kv.host._host_kinds import MLAHostPoolBase
from sgl_core.kv.protocols._protocols import Backend

__all__ = ["IndexerHostPoolBuilder", "SGLangIndexerHostPool", "indexer_host_pool_builder"]

_views: weakref.WeakKeyDictionary[Any, IndexerPagesView] = weakref.WeakKeyDictionary()


def indexer_pages(pool: Any) -> IndexerPagesView:
    """The engine pool's cached ``IndexerPagesView`` (one per pool, so load memos match)."""
    view = _views.get(pool)
    if view is None or view.wrapped is not pool:
        view = IndexerPagesView(pool)
        _views[pool] = view
    return view


def _runs(indices: object, page_size: int, name: str) -> torch.Tensor:
    """The pages of ``indices``: whole, aligned runs of ``page_size`` token indices."""
    if not isinstance(indices, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise IndexDTypeError(f"{name} must be int32 or int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise IndexShapeError(f"{name} must be 1-D, got shape {tuple(indices.shape)}")
    if indices.numel() % page_size:
        raise PageAlignmentError(
            f"{name}: {indices.numel()} indices are not whole pages of {page_size} tokens "
            "(the indexer moves whole pages)"
        )
    runs = indices.to("cpu", torch.int64).view(-1, page_size)
    starts = runs[:, 0]
    expected = starts[:, None] + torch.arange(page_size)
    if bool((starts % page_size).any()) or not torch.equal(runs, expected):
        raise PageAlignmentError(
            f"{name} must be runs of whole, aligned pages of {page_size} tokens"
        )
    return starts // page_size


class SGLangIndexerHostPool:
    """One of our host pools of ``IndexerPagesView`` as SGLang's ``DSAIndexerPoolHost``.

    Sizes and buffers as SGLang's (``page_size`` and ``size`` in tokens, as
    the KV anchor's; ``layer_num`` the indexer layers); the inner pool
    (:attr:`pool`) counts pages, one slot each. Our pools keep no padding
    page, so ``indexer_page_num`` is the anchor's pages (SGLang's has two more).
    """

    # SGLang HostKVCache class attributes (as SGLangHostPool's).
    dcp_size = 1
    dcp_rank = 0
    shared_allocation_domain = None
    stores_page_envelope = False
    can_use_write_back_jit = False
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
        self._base = pool
        self._device_pool = device_pool
        self._layout = HostLayout.parse(pool.layout, argument="layout")
        self._pairs = type(pool).supported_pairs
        fmt = view.paged_format
        self.pool_label = pool_label
        self.device_pool = device_pool
        self.layout: str = self._layout.value
        self.page_size: int = fmt.page_size
        self.size: int = anchor.size
        self.page_num: int = anchor.page_num
        self.device = "cpu"
        self.pin_memory: bool = bool(getattr(pool, "pin_memory", False))
        self.dtype = torch.uint8
        self.indexer_dtype = torch.uint8
        self.start_layer = 0
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
        else:
            shape = (pool.size, self.layer_num, 1, fmt.row_bytes)
        #: SGLang's host buffer (a view of the inner pool's, no copy).
        self.index_k_with_scale_buffer: torch.Tensor = buf.view(shape)

    @property
    def pool(self) -> MLAHostPoolBase:
        """The inner host pool (one slot per page)."""
        return self._base

    @property
    def logical_size(self) -> int:
        return self.size

    @property
    def logical_page_size(self) -> int:
        return self.page_size

    def get_size_per_token(self) -> int:
        return self.size_per_token

    def get_ksize_per_token(self) -> int:
        return self.size_per_token

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        return [self.index_k_with_scale_buffer]

    def clear(self) -> None:
        """SGLang resets its allocator here; the slots are the KV anchor's, nothing to do."""

    def destroy(self) -> None:
        """SGLang unregisters pinned buffers here; ours are torch-owned."""

    # ---------------------------------------------------------- indices
    def l3_indices(self, host_indices: torch.Tensor) -> torch.Tensor:
        """The inner pool's slots (pages) of SGLang's page-aligned token indices."""
        return _runs(host_indices, self.page_size, "host_indices")

    def _pages(
        self, device_pool: Any, host_indices: torch.Tensor, device_indices: torch.Tensor
    ) -> tuple[IndexerPagesView, torch.Tensor, torch.Tensor]:
        if device_pool is not self._device_pool:
            raise PoolMismatchError(
                f"device_pool {type(device_pool).__name__} is not the pool this INDEXER "
                "entry mirrors"
            )
        # Our pool checks the pages themselves (counts, range, duplicates).
        h = _runs(host_indices, self.page_size, "host_indices")
        d = _runs(device_indices, self.page_size, "device_indices")
        return indexer_pages(device_pool), h, d

    def prepare_transfer_indices(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, io_backend: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return host_indices, device_indices

    # -------------------------------------------------------- transfers
    def backup_from_device_all_layer(
        self,
        device_pool: Any,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: str,
    ) -> None:
        io = sglang_io(io_backend, self._pairs, self._layout)
        view, h, d = self._pages(device_pool, host_indices, device_indices)
        self._base.backup_from_device_all_layer(view, h, d, io)

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
        """Device layer ``layer_id``'s index pages (none for a layer with shared top-k)."""
        if is_draft:
            raise PoolMismatchError("is_draft=True: this host pool holds no packed draft layers")
        io = sglang_io(io_backend, self._pairs, self._layout)
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise ArgumentTypeError(f"layer_id must be an int, got {type(layer_id).__name__}")
        if not 0 <= layer_id <= self.end_layer:
            raise LayerIndexError(f"layer_id={layer_id} is outside [0, {self.end_layer + 1})")
        view, h, d = self._pages(device_pool, host_indices, device_indices)
        if layer_id not in self.indexer_layer_ids:
            return  # as SGLang: the layer reuses another's top-k and has no index pages
        self._base.load_to_device_per_layer(view, h, d, self.indexer_layer_ids.index(layer_id), io)

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

    # ------------------------------------------------------------ pages
    def _page(self, index: object) -> int:
        start = page_index(index)  # our pool checks the page's range
        if start % self.page_size:
            raise PageAlignmentError(f"page start {start} is not a multiple of {self.page_size}")
        return start // self.page_size

    def get_data_page(self, index: object, flat: bool = True) -> torch.Tensor:
        """A copy of one page: every indexer layer's row, in SGLang's shape when not flat."""
        page = self._base.get_data_page(self._page(index), flat)
        if flat:
            return page
        if self._layout is HostLayout.LAYER_FIRST:
            return page.reshape(self.layer_num, 1, self.indexer_page_stride_size)
        return page.reshape(1, self.layer_num, 1, self.indexer_page_stride_size)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return self._base.get_dummy_flat_data_page()

    def set_from_flat_data_page(self, index: object, data_page: torch.Tensor) -> None:
        self._base.set_from_flat_data_page(self._page(index), data_page)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """One object per page (page-first layouts, as SGLang's); per layer for ``layer_first``."""
        idx = indices if isinstance(indices, torch.Tensor) else torch.tensor(list(indices))
        ptrs, sizes = self._base.get_page_buffer_meta(self.l3_indices(idx))
        return list(ptrs), list(sizes)

    def get_page_buffer_element_size(self, split_factor: int = 1) -> int:
        if split_factor != 1:
            raise UnsupportedLayoutError(
                f"split_factor={split_factor}: index pages are not split across storage objects"
            )
        _, sizes = self.get_page_buffer_meta(list(range(self.page_size)))
        return int(sizes[0])

    def is_stride_page_aligned(self, page_size_bytes: int = HOST_PAGE_BYTES) -> bool:
        """True when every page's storage objects start ``page_size_bytes``-aligned."""
        if isinstance(page_size_bytes, bool) or not isinstance(page_size_bytes, int):
            raise ArgumentTypeError("page_size_bytes must be an int")
        if page_size_bytes <= 0:
            raise ArgumentTypeError(f"page_size_bytes must be positive, got {page_size_bytes}")
        first, _ = self._base.get_page_buffer_meta([0])
        if any(p % page_size_bytes for p in first):
            return False
        if self._base.size < 2:
            return True
        second, _ = self._base.get_page_buffer_meta([1])
        return all((b - a) % page_size_bytes == 0 for a, b in zip(first, second, strict=True))


class IndexerHostPoolBuilder:
    """SGLang's ``HostPoolBuilder`` for the ``INDEXER`` declaration, building ours.

    ``validate`` and ``build`` take SGLang's keywords. Refused
    (``PoolMismatchError``, before any allocation): a KV anchor that is not
    ours (install ``kv_host_pool_builder`` too), packed MTP draft pools, and a
    declaration whose device pool, owned layers or per-token bytes are not
    the paged indexer we mirror (``index_head_dim`` bytes of keys, then
    one float32 scale, per token).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        pin_memory: bool | None = None,
        io_backend: IOBackend | str | None = None,
    ) -> None:
        if not callable(getattr(backend, "create_host_pool", None)):
            raise ArgumentTypeError(f"backend must be an sgl Backend, got {type(backend).__name__}")
        self.backend = backend
        self.pin_memory = pin_memory
        self.io_backend = io_backend

    def __call__(self) -> IndexerHostPoolBuilder:
        """SGLang constructs its builder with no arguments: this one is already made."""
        return self

    def validate(
        self,
        *,
        decl: Any,
        transfer_page_size: int,
        packed_draft_device_pools: tuple[Any, ...],
    ) -> None:
        if packed_draft_device_pools:
            raise PoolMismatchError(
                "packed MTP draft pools: our host pools hold target layers only"
            )
        device_pool = getattr(decl, "device_pool", None)
        if not has_paged_indexer(device_pool):
            raise PoolMismatchError(
                f"{type(device_pool).__name__} has no paged indexer for an INDEXER entry"
            )
        view = indexer_pages(device_pool)
        fmt = view.paged_format
        if transfer_page_size != fmt.page_size:
            raise PoolMismatchError(
                f"transfer page size {transfer_page_size} is not the indexer's {fmt.page_size}"
            )
        owned = getattr(decl, "owned_device_layers", None)
        if owned is not None and tuple(owned) != fmt.layer_ids:
            raise PoolMismatchError(
                f"declared indexer layers {tuple(owned)} are not the pool's {fmt.layer_ids}"
            )
        info = getattr(decl, "storage_info", None)
        per_token = getattr(info, "bytes_per_token_per_layer", None)
        if per_token != fmt.index_head_dim + SCALE_BYTES or getattr(info, "dtype", None) != (
            torch.uint8
        ):
            raise PoolMismatchError(
                f"declared {per_token} bytes per token and layer "
                f"({getattr(info, 'dtype', None)}); we mirror "
                f"{fmt.index_head_dim + SCALE_BYTES} uint8 (keys, then one float32 scale)"
            )

    def build(
        self,
        *,
        decl: Any,
        anchor_host: Any,
        allocator_type: str = "default",
        packed_draft_device_pools: tuple[Any, ...] = (),
    ) -> SGLangIndexerHostPool:
        if not isinstance(anchor_host, SGLangHostPool):
            raise PoolMismatchError(
                f"the KV anchor is {type(anchor_host).__name__}, not ours: replace "
                "build_kv_host_pool with kv_host_pool_builder as well"
            )
        page_size = getattr(getattr(decl, "device_pool", None), "page_size", None)
        self.validate(
            decl=decl,
            transfer_page_size=page_size if isinstance(page_size, int) else -1,
            packed_draft_device_pools=packed_draft_device_pools,
        )
        view = indexer_pages(decl.device_pool)
        pages = anchor_host.size // view.token_page_size
        host = self.backend.create_host_pool(
            view,
            layout=anchor_host.layout,
            # Half a page more than exact, so float rounding cannot lose one.
            host_to_device_ratio=(pages + 0.5) / view.size,
            pin_memory=self.pin_memory,
            io_backend=self.io_backend,
        )
        if not isinstance(host, MLAHostPoolBase):
            raise PoolMismatchError(f"backend built a {type(host).__name__}, not an MLA host pool")
        return SGLangIndexerHostPool(host, decl.device_pool, anchor=anchor_host)


def indexer_host_pool_builder(
    backend: Backend,
    *,
    pin_memory: bool | None = None,
    io_backend: IOBackend | str | None = None,
) -> IndexerHostPoolBuilder:
    """A drop-in for SGLang's ``DSAIndexerHostPoolBuilder`` that builds our INDEXER entry."""
    return IndexerHostPoolBuilder(backend, pin_memory=pin_memory, io_backend=io_backend)
