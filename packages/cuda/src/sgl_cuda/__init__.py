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

from typing import TYPE_CHECKING

import torch

from sgl_core.backend import CopyTuning, IOBackend, MLADevicePool, PoolBackend
from sgl_core.backend import publish_names as _publish_names
from sgl_cuda import kvcacheio
from sgl_cuda._device_pool import CudaMHADevicePool, CudaMLADevicePool
from sgl_cuda._host_pool import CudaMHAHostPool, CudaMLAHostPool

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

__version__ = "0.1.0"


class CudaBackend(PoolBackend[CudaMLADevicePool, CudaMLAHostPool]):
    """Backend ``"cuda"``: per-layer device pools (MLA and MHA), Triton transfer kernels.

    ``is_available()`` is ``torch.cuda.is_available()``. An explicitly requested
    backend (``get_backend("cuda")``) also builds CPU pools when the Triton
    interpreter is on (``TRITON_INTERPRET=1``); without either, building a pool
    raises ``BackendUnavailableError``.
    """

    name = "cuda"
    #: ``kernel`` (one Triton launch per call) wherever a layout runs it, else ``direct``.
    io_preference = (IOBackend.KERNEL, IOBackend.DIRECT)

    def __init__(self, *, tuning: CopyTuning | None = None) -> None:
        super().__init__(
            CudaMLADevicePool,
            CudaMLAHostPool,
            tuning=tuning,
            mha_device_pool_class=CudaMHADevicePool,
            mha_host_pool_class=CudaMHAHostPool,
        )

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    # ``sgl_core.backend.EmulatedWithoutDevice``: without a GPU, Triton's interpreter.
    def missing_device(self) -> str:
        return "no CUDA device here"

    def start_emulation(self) -> str:
        how = kvcacheio.start_interpreter()
        return (
            f"no CUDA device here; its Triton kernels run in the interpreter on CPU tensors "
            f"({how}); its GB/s are not meaningful, its bit-exact checks are"
        )


backend = CudaBackend()

if TYPE_CHECKING:
    from sgl_core.backend import (
        Backend,
        EmulatedWithoutDevice,
        MHADevicePool,
        MHAHostPool,
        MLAHostPool,
    )

    _b: Backend = backend
    _e: EmulatedWithoutDevice = backend
    _d: MLADevicePool = CudaMLADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, kv_lora_rank=1, qk_rope_head_dim=1, layer_num=1
    )
    _h: MLAHostPool = CudaMLAHostPool(_d, layout="layer_first")
    _md: MHADevicePool = CudaMHADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
    )
    _mh: MHAHostPool = CudaMHAHostPool(_md, layout="page_head")

_publish_names(__name__, globals())  # sgl_cuda.CudaMLAHostPool, not sgl_cuda._host_pool...
del _publish_names
