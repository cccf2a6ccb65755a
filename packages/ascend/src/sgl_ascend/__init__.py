"""sgl_ascend: the Ascend NPU backend of the sgl device packages.

Installed, it registers ``ascend = "sgl_ascend:backend"`` in entry-point
group ``sgl.backends``; ``sgl_core.get_backend()`` selects it where an NPU is
usable, and ``sgl_core.get_backend("ascend")`` returns it anywhere (pools then
live on CPU tensors). Its pools and MoE methods are listed in docs/design.md.

``torch_npu`` is the optional ``sgl-ascend[npu]`` extra, imported lazily by
``sgl_ascend._npu`` only. No module here imports triton, sgl_cuda or
sgl_kernel.

Example::

    import sgl_core, torch
    backend = sgl_core.get_backend("ascend")
    dev = backend.create_device_pool(size=4096, page_size=64, dtype=torch.bfloat16,
                                     kv_lora_rank=512, qk_rope_head_dim=64, layer_num=61)
    host = backend.create_host_pool(dev, layout="page_first_kv_split")
    host.backup_from_device_all_layer(dev, host_idx, dev_idx, "kernel_ascend")
    host.load_to_device_per_layer(dev, host_idx, dev_idx, layer_id, "kernel_ascend")
"""

from __future__ import annotations

from sgl_ascend._backend import AscendBackend, backend
from sgl_ascend._device_kinds import AscendMHADevicePool, AscendMLADevicePool
from sgl_ascend._host_pool import AscendMHAHostPool, AscendMLAHostPool
from sgl_ascend._moe import (
    AscendMoEMethod,
    AscendW8A8DynamicMoEMethod,
    W8A8MoEWeights,
    quantize_per_channel,
    quantize_per_token,
)
from sgl_core.backend import publish_names as _publish_names

__version__ = "0.1.0"

__all__ = [
    "AscendBackend",
    "AscendMHADevicePool",
    "AscendMHAHostPool",
    "AscendMLADevicePool",
    "AscendMLAHostPool",
    "AscendMoEMethod",
    "AscendW8A8DynamicMoEMethod",
    "W8A8MoEWeights",
    "__version__",
    "backend",
    "quantize_per_channel",
    "quantize_per_token",
]

_publish_names(__name__, globals())  # sgl_ascend.AscendBackend, not sgl_ascend._backend...
del _publish_names
