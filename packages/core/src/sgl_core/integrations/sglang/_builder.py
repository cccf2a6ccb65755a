"""A drop-in for SGLang 0.5.23's ``hybrid_pool_assembler.build_kv_host_pool``.

SGLang's default HiCache stack for a plain KV model builds its host pool with
``build_kv_host_pool(kv_pool=..., page_size=..., ...)`` and has no option to
choose another host pool class, so a deployment replaces that one function
before the scheduler builds its cache (docs/sglang.md)::

    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as asm
    asm.build_kv_host_pool = kv_host_pool_builder(backend, layout="page_first")

Everything else (the group, the controller, storage attach through
``register_mem_host_pool_v2``) stays SGLang's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_core.errors import ArgumentTypeError, PoolMismatchError
from sgl_core.integrations.sglang._host import SGLangHostPool, wrap_host_pool
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.device._foreign_pool import ForeignMLADevicePool
from sgl_core.kv.device._paged_indexer import has_paged_indexer
from sgl_core.kv.host._host_kinds import MHAHostPoolBase, MLAHostPoolBase
from sgl_core.kv.protocols._protocols import Backend

__all__ = ["kv_host_pool_builder"]


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
    SGLang, and a ``host_size`` SGLang passes (its split of ``--hicache-size``
    between pools) wins over both. Refused (``PoolMismatchError``): packed MTP
    draft pools (ours hold target layers only), an ``override_kv_cache_dim``
    other than the device pool's row width. A DeepSeek-V3.2 pool
    (``DSATokenToKVPool``) gets a host pool of its packed KV rows only: SGLang's
    ``_DsaStrategy`` moves the indexer in its own ``INDEXER`` entry, which
    :func:`~sgl_core.integrations.sglang.indexer_host_pool_builder` builds.
    """
    if not callable(getattr(backend, "create_host_pool", None)):
        raise ArgumentTypeError(f"backend must be an sgl Backend, got {type(backend).__name__}")
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
        if mtp_draft_device_pools:
            raise PoolMismatchError(
                "packed MTP draft pools: our host pools hold target layers only"
            )
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
        if rows is not None:
            assert isinstance(host, MLAHostPoolBase)  # an MLA view makes an MLA pool
            return SGLangHostPool(host, pool_label=pool_label, kv_rows=rows)
        return wrap_host_pool(host, pool_label=pool_label)

    return build_kv_host_pool
