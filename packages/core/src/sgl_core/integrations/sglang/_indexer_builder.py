"""The builder of SGLang 0.5.23's ``INDEXER`` entry, building ours.

``make_dsa_indexer_pool_decl`` calls ``DSAIndexerHostPoolBuilder()`` when the
DeepSeek-V3.2 stack is built; SGLang has no option for another builder (as for
``build_kv_host_pool``), so a deployment replaces that name with ours (calling
it returns itself)::

    from sglang.srt.mem_cache.pool_host import dsa
    dsa.DSAIndexerHostPoolBuilder = indexer_host_pool_builder(backend)

The entry it builds is :class:`~sgl_core.integrations.sglang.SGLangIndexerHostPool`.
"""

from __future__ import annotations

from typing import Any

import torch

from sgl_core.errors import ArgumentTypeError, PoolMismatchError
from sgl_core.integrations.sglang._host import SGLangHostPool
from sgl_core.integrations.sglang._indexer_pages import indexer_pages
from sgl_core.integrations.sglang._indexer_pool import SGLangIndexerHostPool
from sgl_core.kv._enums import IOBackend
from sgl_core.kv.device._indexer import SCALE_BYTES
from sgl_core.kv.device._paged_indexer import has_paged_indexer
from sgl_core.kv.host._host_kinds import MLAHostPoolBase
from sgl_core.kv.protocols._protocols import Backend

__all__ = ["IndexerHostPoolBuilder", "indexer_host_pool_builder"]


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
