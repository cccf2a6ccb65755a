"""sgl_ascend: the Ascend NPU backend of the sgl device packages.

Installed, it registers ``ascend = "sgl_ascend:backend"`` in entry-point
group ``sgl.backends``; ``sgl_core.get_backend()`` selects it where an NPU is
usable, and ``sgl_core.get_backend("ascend")`` returns it anywhere (pools then
live on CPU tensors). What it provides:

* :class:`AscendMLADevicePool`: contiguous 5-D layer-major ``k_buffer`` /
  ``v_buffer`` (and optional indexer ``index_k_buffer`` / fp32
  ``index_k_scale_buffer``); no ``data_ptrs``, no per-layer list.
* :class:`AscendMLAHostPool`: layout ``page_first_kv_split`` with io backend
  ``kernel_ascend``; all-layer backup, true per-layer load, L3 page helpers.
* :class:`AscendMHADevicePool`: MHA / GQA models, contiguous 5-D layer-major
  ``k_buffer (layer_num, page_num, page_size, head_num, head_dim)`` and
  ``v_buffer`` (``v_head_dim``), the Ascend engine's own layout.
* :class:`AscendMHAHostPool`: its host pool, also ``page_first_kv_split`` /
  ``kernel_ascend`` (K and V page-major), true per-layer load, L3 helpers.
* :class:`AscendMoEMethod` / :class:`AscendW8A8DynamicMoEMethod`: grouped
  experts, unquantized or W8A8 dynamic.

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

    # MHA / GQA models: the same calls on K and V pools
    mha = backend.create_mha_device_pool(size=4096, page_size=128, dtype=torch.bfloat16,
                                         head_num=8, head_dim=128, layer_num=32)
    mha_host = backend.create_host_pool(mha, layout="page_first_kv_split")
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
