"""The portable ``torch`` backend: runs on any torch device.

It is the embedded default on a machine without accelerators and the oracle
the conformance suite compares other backends against. Device pools are the
per-layer layout; host pools support every token-row layout with ``direct``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from sgl_core._device_pool import PerLayerMLADevicePool
from sgl_core._enums import HostLayout, IOBackend
from sgl_core._protocols import MLADevicePool
from sgl_core._token_host_pool import TokenRowHostPool

__all__ = ["TorchBackend", "backend"]


class TorchBackend:
    """Backend ``"torch"``: always available."""

    name = "torch"

    @property
    def supported_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        return TokenRowHostPool.supported_pairs

    def is_available(self) -> bool:
        return True

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
    ) -> PerLayerMLADevicePool:
        return PerLayerMLADevicePool(
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
    ) -> TokenRowHostPool:
        return TokenRowHostPool(
            device_pool,
            layout=layout,
            host_to_device_ratio=host_to_device_ratio,
            host_size_gb=host_size_gb,
            pin_memory=pin_memory,
            io_backend=io_backend,
        )


backend = TorchBackend()

if TYPE_CHECKING:
    from sgl_core._protocols import Backend, MLAHostPool

    _backend: Backend = backend
    _device: MLADevicePool = backend.create_device_pool(
        size=1, page_size=1, dtype=torch.bfloat16, kv_lora_rank=1, qk_rope_head_dim=1, layer_num=1
    )
    _host: MLAHostPool = backend.create_host_pool(_device, layout="layer_first")
