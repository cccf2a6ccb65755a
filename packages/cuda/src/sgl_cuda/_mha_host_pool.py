"""CUDA MHA host pool: the core MHA host layouts, moved by Triton kernels or slice copies.

Supported pairs (docs/design.md section 10), ``kernel`` first where a layout runs it:

* ``layer_first``        ``kernel``, ``direct``
* ``page_first``         ``kernel``
* ``page_first_direct``  ``direct``
* ``page_head``          ``kernel``

Buffers, L3 page helpers and validation are ``MHATokenHostPool``'s (SGLang's
byte order: K and V halves of one ``(2, ...)`` tensor when
``head_dim == v_head_dim``). Transfers are stream-ordered as for
``CudaMLAHostPool``: they return once queued; ``synchronize()`` waits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from sgl_core.backend import (
    HostLayout,
    HostSide,
    IOBackend,
    MHADevicePool,
    MHATokenHostPool,
)
from sgl_core.errors import UnsupportedLayoutError
from sgl_cuda._host_pool import StreamFence
from sgl_cuda._mha_movers import MHACudaDirectMover, MHAKernelMover

__all__ = ["CudaMHAHostPool"]


class CudaMHAHostPool(MHATokenHostPool):
    """Host (L2) copy of a per-layer MHA device pool, for the ``cuda`` backend.

    ``k_data_ptrs`` / ``v_data_ptrs`` are ``torch.uint64`` tables of the
    per-layer host views' addresses on the device pool's device (strided views
    for the page-first layouts), as in SGLang's MHA host pool. Host memory is
    pinned when CUDA is available, which the ``kernel`` io backend needs.
    """

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, Callable[[Any], Any]]]] = {
        HostLayout.LAYER_FIRST: {
            IOBackend.KERNEL: MHAKernelMover,
            IOBackend.DIRECT: MHACudaDirectMover,
        },
        HostLayout.PAGE_FIRST: {IOBackend.KERNEL: MHAKernelMover},
        HostLayout.PAGE_FIRST_DIRECT: {IOBackend.DIRECT: MHACudaDirectMover},
        HostLayout.PAGE_HEAD: {IOBackend.KERNEL: MHAKernelMover},
    }

    fence: StreamFence
    k_data_ptrs: torch.Tensor
    v_data_ptrs: torch.Tensor

    def _mover_of(self, factory: Callable[[Any], Any], side: HostSide) -> Any:
        # This backend's movers still read the pool (its fence and host tables).
        return factory(self)

    def _allocate_buffers(self, device_pool: MHADevicePool) -> None:
        if IOBackend.KERNEL in self.supported_pairs[self.layout]:
            self._check_kernel_rows()
        super()._allocate_buffers(device_pool)
        self.fence = StreamFence()
        self._ptr_values = tuple(
            [self._layer_view(host, i).data_ptr() for i in range(self.layer_num)]
            for host in (self.k_buffer, self.v_buffer)
        )
        self._ptr_tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.k_data_ptrs, self.v_data_ptrs = self.host_tables(device_pool.device)
        if (
            device_pool.device.type == "cuda"
            and not self.pin_memory
            and self.supported_pairs[self.layout] == frozenset({IOBackend.KERNEL})
        ):
            raise UnsupportedLayoutError(
                f"layout={self.layout.value!r} runs only the 'kernel' io backend, which "
                "reaches host memory from the GPU and needs it pinned (pin_memory=False given)"
            )

    def _check_kernel_rows(self) -> None:
        """Refuse rows no ``kernel`` transfer could move, before any memory is taken.

        The kernels move rows (``page_head``: each head's slice of a row) as
        int64 words; K and V are checked alike, so no transfer can stop
        between its K and V halves on a row size.
        """
        page_head = self.layout is HostLayout.PAGE_HEAD
        unit = "a head's slice of a row" if page_head else "a row"
        for name, dim in (("K", self.head_dim), ("V", self.v_head_dim)):
            heads = 1 if page_head else self.head_num
            size = heads * dim * self.shape.itemsize
            if size % 8:
                raise UnsupportedLayoutError(
                    f"layout={self.layout.value!r} runs io_backend='kernel', which moves rows "
                    f"as 8-byte words; {unit} of {name} here is {size} bytes ({heads} x {dim} "
                    f"x {self.dtype}), not a multiple of 8: use layout 'page_first_direct' "
                    "(io 'direct') or the 'torch' backend"
                )

    def _layer_view(self, host: torch.Tensor, layer_id: int) -> torch.Tensor:
        if self.layout is HostLayout.LAYER_FIRST:
            return host[layer_id]
        if self.layout is HostLayout.PAGE_HEAD:
            return host[:, :, :, layer_id]
        return host[:, layer_id]

    def host_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V host layers' address tables on ``device`` (built once per device)."""
        tables = self._ptr_tables.get(device)
        if tables is None:
            k, v = (torch.tensor(p, dtype=torch.uint64, device=device) for p in self._ptr_values)
            tables = self._ptr_tables[device] = (k, v)
        return tables
