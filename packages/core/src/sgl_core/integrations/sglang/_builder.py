"""Drop-ins for SGLang 0.5.23's host pool builders, building ours (why and how a
deployment swaps them in: docs/sglang.md, "Running an SGLang server on our packages").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sgl_core.errors import ArgumentTypeError, PoolMismatchError
from sgl_core.integrations.sglang._host import SGLangHostPool
from sgl_core.integrations.sglang._indexer_pool import SGLangIndexerHostPool, indexer_pages
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.device._foreign_pool import ForeignMLADevicePool
from sgl_core.kv.device._indexer import SCALE_BYTES
from sgl_core.kv.device._paged_indexer import has_paged_indexer
from sgl_core.kv.host._host_kinds import MHAHostPoolBase, MLAHostPoolBase
from sgl_core.kv.protocols._protocols import Backend

__all__ = ["IndexerHostPoolBuilder", "indexer_host_pool_builder", "kv_host_pool_builder"]


def _check_backend(backend: object) -> None:
    if not callable(getattr(backend, "create_host_pool", None)):
        raise ArgumentTypeError(f"backend must be an sgl Backend, got {type(backend).__name__}")


def _check_no_drafts(draft_pools: tuple[Any, ...]) -> None:
    if draft_pools:
        raise PoolMismatchError("packed MTP draft pools: our host pools hold target layers only")


def kv_host_pool_builder(
    backend: Backend,
    *,
    layout: HostLayout | str,
    host_to_device_ratio: float = 2.0,
    host_size_gb: float = 0.0,
    pin_memory: bool | None = None,
    io_backend: IOBackend | str | None = None,
) -> Callable[..., SGLangHostPool]:
    """A function with ``build_kv_host_pool``'s keywords that builds our host pool.

    ``layout`` should be the server's ``--hicache-mem-layout``; ``host_size_gb``
    (SGLang's ``--hicache-size``, GB) wins over ``host_to_device_ratio`` as in
    SGLang, and a ``host_size`` SGLang passes wins over both. What it refuses
    (``PoolMismatchError``), and the DeepSeek-V3.2 KV entry of packed KV rows
    only, are in docs/sglang.md.
    """
    _check_backend(backend)
    HostLayout.parse(layout, argument="layout")  # a bad name fails here, not at startup

    def build_kv_host_pool(
        *,
        kv_pool: Any,
        page_size: int,
        use_mla: bool | None = None,
        override_kv_cache_dim: int | None = None,
        host_size: float | None = None,
        mtp_draft_device_pools: tuple[Any, ...] = (),
        pool_label: str = "kv",
    ) -> SGLangHostPool:
        _check_no_drafts(mtp_draft_device_pools)
        if page_size != getattr(kv_pool, "page_size", None):
            raise PoolMismatchError(
                f"page_size {page_size} differs from the device pool's "
                f"{getattr(kv_pool, 'page_size', None)}"
            )
        if override_kv_cache_dim is not None and override_kv_cache_dim != getattr(
            kv_pool, "kv_cache_dim", None
        ):
            raise PoolMismatchError(
                f"override_kv_cache_dim={override_kv_cache_dim} is not the device pool's row width"
            )
        size_gb = host_size_gb if host_size is None else float(host_size)
        # A DeepSeek-V3.2 pool: this entry holds its packed KV rows only; SGLang's
        # stack moves the indexer in its INDEXER entry (indexer_host_pool_builder).
        rows = ForeignMLADevicePool(kv_pool) if has_paged_indexer(kv_pool) else None
        device: Any = kv_pool if rows is None else rows
        host = backend.create_host_pool(
            device,
            layout=layout,
            host_to_device_ratio=host_to_device_ratio,
            host_size_gb=size_gb,
            pin_memory=pin_memory,
            io_backend=io_backend,
        )
        if use_mla is not None and use_mla is isinstance(host, MHAHostPoolBase):
            raise PoolMismatchError(
                f"SGLang asked for use_mla={use_mla}, the device pool is the other kind"
            )
        return SGLangHostPool(host, pool_label=pool_label, kv_rows=rows)

    return build_kv_host_pool


class IndexerHostPoolBuilder:
    """SGLang's ``HostPoolBuilder`` for the ``INDEXER`` declaration, building ours.

    ``validate`` and ``build`` take SGLang's keywords; what they refuse
    (``PoolMismatchError``, before any allocation) is in docs/sglang.md.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        pin_memory: bool | None = None,
        io_backend: IOBackend | str | None = None,
    ) -> None:
        _check_backend(backend)
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
        _check_no_drafts(packed_draft_device_pools)
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
        per_token, dtype = (getattr(info, n, None) for n in ("bytes_per_token_per_layer", "dtype"))
        if per_token != fmt.index_head_dim + SCALE_BYTES or dtype != torch.uint8:
            raise PoolMismatchError(
                f"declared {per_token} bytes per token and layer ({dtype}); we mirror "
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
