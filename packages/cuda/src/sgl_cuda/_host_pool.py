"""CUDA MLA host pool: token-row host layouts moved by Triton kernels or slice copies.

Supported pairs (docs/design.md section 10), one mover each:

* ``layer_first``        ``kernel``, ``direct``
* ``page_first``         ``kernel``
* ``page_first_direct``  ``direct``

The movers live in ``sgl_cuda._movers`` and the fence in
``sgl_cuda._stream_fence``; this module re-exports both for its importers.

Transfers are stream-ordered, as in the serving engines: they return once
queued on the current CUDA stream, so the engine can overlap them with
compute and track them with its own events. Both movers record the point
after each transfer in the pool's ``StreamFence``; the pool's own host-side
readers and writers (the L3 page helpers) first wait for it, other host-side
readers call :meth:`CudaMLAHostPool.synchronize`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from sgl_core.backend import (
    HostLayout,
    HostSide,
    IOBackend,
    MLADevicePool,
    TokenRowHostPool,
)
from sgl_core.errors import UnsupportedLayoutError
from sgl_cuda._movers import DirectMover, KernelMover
from sgl_cuda._stream_fence import StreamFence

__all__ = ["CudaMLAHostPool", "DirectMover", "KernelMover", "StreamFence"]


class CudaMLAHostPool(TokenRowHostPool):
    """Host (L2) copy of a per-layer MLA device pool, for the ``cuda`` backend.

    ``data_refs`` are the per-layer host views (strided for ``page_first``) and
    ``data_ptrs`` a ``torch.uint64`` table of their addresses on the device
    pool's device. Host memory is pinned when CUDA is available, which the
    ``kernel`` io backend needs to reach it from the GPU.
    """

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, Callable[[Any], Any]]]] = {
        HostLayout.LAYER_FIRST: {IOBackend.KERNEL: KernelMover, IOBackend.DIRECT: DirectMover},
        HostLayout.PAGE_FIRST: {IOBackend.KERNEL: KernelMover},
        HostLayout.PAGE_FIRST_DIRECT: {IOBackend.DIRECT: DirectMover},
    }

    data_refs: list[torch.Tensor]
    data_ptrs: torch.Tensor
    fence: StreamFence

    def _mover_of(self, factory: Callable[[Any], Any], side: HostSide) -> Any:
        # This backend's movers still read the pool (its fence and host tables).
        return factory(self)

    def _allocate_buffers(self, device_pool: MLADevicePool) -> None:
        row = self.shape.token_stride_size
        if IOBackend.KERNEL in self.supported_pairs[self.layout] and row % 8:
            # The kernels move rows as int64 words; the pool would hold rows no
            # kernel transfer could move. (Indexer rows move by the direct engine.)
            raise UnsupportedLayoutError(
                f"layout={self.layout.value!r} runs io_backend='kernel', which moves rows as "
                f"8-byte words; a row here is {row} bytes ({self.kv_cache_dim} x {self.dtype}), "
                "not a multiple of 8: use layout 'page_first_direct' (io 'direct') or the "
                "'torch' backend"
            )
        super()._allocate_buffers(device_pool)
        if self.layout is HostLayout.LAYER_FIRST:
            self.data_refs = [self.kv_buffer[i] for i in range(self.layer_num)]
        else:
            self.data_refs = [self.kv_buffer[:, i] for i in range(self.layer_num)]
        self._ptr_values = [ref.data_ptr() for ref in self.data_refs]
        self._ptr_tables: dict[torch.device, torch.Tensor] = {}
        self.fence = StreamFence()
        self.data_ptrs = self.host_table(device_pool.device)
        if (
            device_pool.device.type == "cuda"
            and not self.pin_memory
            and self.supported_pairs[self.layout] == frozenset({IOBackend.KERNEL})
        ):
            raise UnsupportedLayoutError(
                f"layout={self.layout.value!r} runs only the 'kernel' io backend, which "
                "reaches host memory from the GPU and needs it pinned (pin_memory=False given)"
            )

    def host_table(self, device: torch.device) -> torch.Tensor:
        """The host layers' address table on ``device`` (built once per device)."""
        table = self._ptr_tables.get(device)
        if table is None:
            table = torch.tensor(self._ptr_values, dtype=torch.uint64, device=device)
            self._ptr_tables[device] = table
        return table

    @property
    def reuse_index_uploads(self) -> bool:
        """Opt-in: per-layer ``kernel`` loads of one transfer share one index upload."""
        mover = self._movers.get(IOBackend.KERNEL)
        return isinstance(mover, KernelMover) and mover.reuse_index_uploads

    @reuse_index_uploads.setter
    def reuse_index_uploads(self, value: bool) -> None:
        mover = self._movers.get(IOBackend.KERNEL)
        if isinstance(mover, KernelMover):
            mover.reuse_index_uploads = bool(value)
