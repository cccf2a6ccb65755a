"""CUDA host pools: token-row host layouts moved by Triton kernels or slice copies.

One implementation (:class:`CudaTokenHostPool`) for every kind; the engine
classes add only their movers table and kind accessors. Supported pairs:
docs/design.md section 10; stream order: section 6 ("CUDA stream order").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from sgl_core.backend import (
    HostLayout,
    HostSide,
    IOBackend,
    MHATokenHostPool,
    Mover,
    MoverFactory,
    TokenHostPool,
    TokenRowHostPool,
    layout_facts,
)
from sgl_core.errors import UnsupportedLayoutError
from sgl_cuda._direct_mover import CudaDirectMover
from sgl_cuda._kernels import StreamFence
from sgl_cuda._movers import KernelMover, address_table, layer_views

__all__ = ["CudaMHAHostPool", "CudaMLAHostPool", "CudaTokenHostPool", "StreamFence"]

#: This backend's movers: built with the pool's fence (``CudaTokenHostPool._mover_of``).
_FENCED = (KernelMover, CudaDirectMover)


class CudaTokenHostPool(TokenHostPool[Any, Any]):
    """The cuda host pool of any kind: the core token rows plus the cuda movers' needs.

    It refuses, before any memory is taken, rows no ``kernel`` transfer could
    move and unpinned memory where ``kernel`` is the only io; keeps the
    per-layer host views of each every-layer component and their address
    tables on the device pool's device; and builds this backend's movers with
    the pool's one ``StreamFence``.
    """

    fence: StreamFence

    def _allocate_buffers(self, device_pool: Any) -> None:
        ios = self.supported_pairs[self.layout]
        # Refuse rows no ``kernel`` transfer could move, before any memory is taken. The
        # kernels move rows (``page_head``: each head's slice of a row) as int64 words;
        # every part is checked, so no transfer can stop between K and V on a row size.
        # Rows kept on a layer subset (the DSA indexer) move by the direct engine.
        per_head = not layout_facts(self.layout).heads_inner
        unit = "a head's slice of a row" if per_head else "a row"
        if IOBackend.KERNEL in ios:
            for c in self.spec.components:
                heads = 1 if per_head else c.heads
                size = heads * c.dim * c.itemsize
                if c.layers is None and size % 8:
                    raise UnsupportedLayoutError(
                        f"layout={self.layout.value!r} runs io_backend='kernel', which moves "
                        f"rows as 8-byte words; {unit} of {c.name} here is {size} bytes "
                        f"({heads} x {c.dim} x {c.dtype}), not a multiple of 8: use layout "
                        "'page_first_direct' (io 'direct') or the 'torch' backend"
                    )
        if device_pool.device.type == "cuda" and not self.pin_memory and ios == {IOBackend.KERNEL}:
            raise UnsupportedLayoutError(
                f"layout={self.layout.value!r} runs only the 'kernel' io backend, which "
                "reaches host memory from the GPU and needs it pinned (pin_memory=False given)"
            )
        super()._allocate_buffers(device_pool)
        self.fence = StreamFence()
        #: Per every-layer component (spec order): its per-layer host views and their table.
        self._layer_refs = layer_views(self.host_side)
        self._layer_tables = tuple(
            address_table(views, device_pool.device) for views in self._layer_refs
        )

    def _make_mover(self, factory: MoverFactory) -> Mover[Any]:
        # The kernel mover moves the DSA indexer's rows itself (no wrapper: a per-layer
        # load stays within three frames); an engine's paged indexer keeps the core's.
        if factory is KernelMover and self._paged is None and self._indexer is not None:
            return KernelMover(self.host_side, self.fence)
        return super()._make_mover(factory)

    def _mover_of(self, factory: MoverFactory, side: HostSide) -> Mover[Any]:
        for fenced in _FENCED:
            if factory is fenced:  # this backend's movers share the pool's fence
                return fenced(side, self.fence)
        return factory(side)

    @property
    def reuse_index_uploads(self) -> bool:
        """Opt-in: per-layer ``kernel`` loads of one transfer share one index upload."""
        mover = self._kernel_mover()
        return mover is not None and mover.reuse_index_uploads

    @reuse_index_uploads.setter
    def reuse_index_uploads(self, value: bool) -> None:
        mover = self._kernel_mover()
        if mover is not None:
            mover.reuse_index_uploads = bool(value)

    def _kernel_mover(self) -> KernelMover | None:
        # With an indexer the KV mover is wrapped (core IndexerMover keeps it as ``kv``).
        mover = self._movers.get(IOBackend.KERNEL)
        mover = getattr(mover, "kv", mover)
        return mover if isinstance(mover, KernelMover) else None


class CudaMLAHostPool(CudaTokenHostPool, TokenRowHostPool):
    """Host (L2) copy of a per-layer MLA device pool, for the ``cuda`` backend.

    ``data_refs``: the per-layer host views; ``data_ptrs``: their addresses
    (``torch.uint64``) on the device pool's device.
    """

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        HostLayout.LAYER_FIRST: {IOBackend.KERNEL: KernelMover, IOBackend.DIRECT: CudaDirectMover},
        HostLayout.PAGE_FIRST: {IOBackend.KERNEL: KernelMover},
        HostLayout.PAGE_FIRST_DIRECT: {IOBackend.DIRECT: CudaDirectMover},
    }

    @property
    def data_refs(self) -> list[torch.Tensor]:
        return self._layer_refs[0]

    @property
    def data_ptrs(self) -> torch.Tensor:
        return self._layer_tables[0]


class CudaMHAHostPool(CudaTokenHostPool, MHATokenHostPool):
    """Host (L2) copy of a per-layer MHA device pool, for the ``cuda`` backend.

    ``k_data_ptrs`` / ``v_data_ptrs``: the per-layer host views' addresses
    (``torch.uint64``) on the device pool's device, as in SGLang's MHA host pool.
    """

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
        **CudaMLAHostPool.movers,
        HostLayout.PAGE_HEAD: {IOBackend.KERNEL: KernelMover},
    }

    @property
    def k_data_ptrs(self) -> torch.Tensor:
        return self._layer_tables[0]

    @property
    def v_data_ptrs(self) -> torch.Tensor:
        return self._layer_tables[1]
