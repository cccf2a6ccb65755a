"""The portable ``torch`` backend: runs on any torch device.

It is the embedded default on a machine without accelerators and the oracle
the conformance suite compares other backends against. Device pools are the
per-layer layout; host pools support every token-row layout with ``direct``,
for MLA and for MHA (``PerLayerMHADevicePool``, ``MHATokenHostPool``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sgl_core.backends._backend_base import PoolBackend
from sgl_core.kv._enums import IOBackend
from sgl_core.kv.device._device_pool import PerLayerMHADevicePool, PerLayerMLADevicePool
from sgl_core.kv.host._token_host_pool import MHATokenHostPool, TokenRowHostPool
from sgl_core.transfer.copy._tuning import CopyTuning

__all__ = ["TorchBackend", "backend"]


class TorchBackend(PoolBackend[PerLayerMLADevicePool, TokenRowHostPool]):
    """Backend ``"torch"``: always available."""

    name = "torch"
    #: Every layout runs only ``direct`` (torch copies, no kernels).
    io_preference = (IOBackend.DIRECT,)

    def __init__(self, *, tuning: CopyTuning | None = None) -> None:
        super().__init__(
            PerLayerMLADevicePool,
            TokenRowHostPool,
            tuning=tuning,
            mha_device_pool_class=PerLayerMHADevicePool,
            mha_host_pool_class=MHATokenHostPool,
        )


backend = TorchBackend()

if TYPE_CHECKING:
    from sgl_core.kv.protocols._kv_protocols import (
        MHADevicePool,
        MHAHostPool,
        MLADevicePool,
        MLAHostPool,
    )
    from sgl_core.kv.protocols._protocols import Backend

    _backend: Backend = backend
    _device: MLADevicePool = backend.create_device_pool(
        size=1, page_size=1, dtype=torch.bfloat16, kv_lora_rank=1, qk_rope_head_dim=1, layer_num=1
    )
    _host: MLAHostPool = backend.create_host_pool(_device, layout="layer_first")
    _mha_device: MHADevicePool = backend.create_mha_device_pool(
        size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
    )
    _mha_host: MHAHostPool = backend.create_host_pool(_mha_device, layout="page_head")
