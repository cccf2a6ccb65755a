"""The ``cuda`` backend object registered under entry-point group ``sgl.backends``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._protocols import MLADevicePool
from sgl_cuda._device_pool import CudaMLADevicePool
from sgl_cuda._host_pool import CudaMLAHostPool

__all__ = ["CudaBackend", "backend"]


class CudaBackend:
    """Backend ``"cuda"``: per-layer device pools, Triton transfer kernels.

    ``is_available()`` is ``torch.cuda.is_available()``. An explicitly requested
    backend (``get_backend("cuda")``) also builds CPU pools when the Triton
    interpreter is on (``TRITON_INTERPRET=1``); without either, building a pool
    raises ``BackendUnavailableError``.
    """

    name = "cuda"

    @property
    def supported_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        return CudaMLAHostPool.supported_pairs

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def create_device_pool(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
    ) -> CudaMLADevicePool:
        return CudaMLADevicePool(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            layer_num=layer_num,
            device=device,
        )

    def create_host_pool(
        self,
        device_pool: MLADevicePool,
        *,
        layout: HostLayout | str,
        host_to_device_ratio: float = 2.0,
        host_size_gb: float = 0.0,
        pin_memory: bool | None = None,
        io_backend: IOBackend | str | None = None,
    ) -> CudaMLAHostPool:
        return CudaMLAHostPool(
            device_pool,
            layout=layout,
            host_to_device_ratio=host_to_device_ratio,
            host_size_gb=host_size_gb,
            pin_memory=pin_memory,
            io_backend=io_backend,
        )

    def __repr__(self) -> str:
        return "CudaBackend()"


backend = CudaBackend()

if TYPE_CHECKING:
    from sgl_core._protocols import Backend, MLAHostPool

    _b: Backend = backend
    _d: MLADevicePool = CudaMLADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, kv_lora_rank=1, qk_rope_head_dim=1, layer_num=1
    )
    _h: MLAHostPool = CudaMLAHostPool(_d, layout="layer_first")
