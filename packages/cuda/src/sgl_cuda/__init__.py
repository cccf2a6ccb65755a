"""sgl_cuda: the CUDA backend of the sgl device packages.

Registered as backend ``"cuda"`` (entry point ``sgl.backends``)::

    import sgl_core
    backend = sgl_core.get_backend("cuda")
    dev = backend.create_device_pool(size=4096, page_size=64, dtype=torch.bfloat16,
                                     kv_lora_rank=512, qk_rope_head_dim=64, layer_num=61)
    host = backend.create_host_pool(dev, layout="page_first", io_backend="kernel")

The transfer functions with the upstream engine's names are in
:mod:`sgl_cuda.kvcacheio`; the GGML MoE method is in ``sgl_cuda.quantization``
(imported on demand, not by ``import sgl_cuda``). Triton is imported on the
first transfer.
"""

from __future__ import annotations

from sgl_core.backend import publish_names as _publish_names
from sgl_cuda import kvcacheio
from sgl_cuda._backend import CudaBackend, backend
from sgl_cuda._device_pool import CudaMHADevicePool, CudaMLADevicePool
from sgl_cuda._host_pool import CudaMHAHostPool, CudaMLAHostPool

__version__ = "0.1.0"

__all__ = [
    "CudaBackend",
    "CudaMHADevicePool",
    "CudaMHAHostPool",
    "CudaMLADevicePool",
    "CudaMLAHostPool",
    "__version__",
    "backend",
    "kvcacheio",
]

_publish_names(__name__, globals())  # sgl_cuda.CudaBackend, not sgl_cuda._backend...
del _publish_names
