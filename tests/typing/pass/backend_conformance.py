"""Every concrete backend class, as returned, satisfies its sgl_core protocol.

This repeats, from the outside, the static conformance lines each package
keeps in its own modules (``if TYPE_CHECKING: _h: MLAHostPool = ...``): a
protocol change that a backend does not follow fails ``mypy --strict`` here.
Type-checked only; nothing here is executed.
"""

from __future__ import annotations

import torch

import sgl_ascend
import sgl_core
import sgl_core.backend
import sgl_cuda
from sgl_ascend import AscendMoEMethod, AscendW8A8DynamicMoEMethod
from sgl_core import (
    Backend,
    MHADevicePool,
    MHAHostPool,
    MLADevicePool,
    MLAHostPool,
    MoEMethod,
    TorchMoEMethod,
)
from sgl_cuda.quantization import GGMLMoEMethod


def backends() -> list[Backend]:
    return [sgl_core.TorchBackend(), sgl_cuda.backend, sgl_ascend.backend]


def device_pools(
    torch_pool: sgl_core.backend.PerLayerMLADevicePool,
    cuda_pool: sgl_cuda.CudaMLADevicePool,
    ascend_pool: sgl_ascend.AscendMLADevicePool,
) -> list[MLADevicePool]:
    return [torch_pool, cuda_pool, ascend_pool]


def host_pools(
    torch_pool: sgl_core.backend.TokenRowHostPool,
    cuda_pool: sgl_cuda.CudaMLAHostPool,
    ascend_pool: sgl_ascend.AscendMLAHostPool,
) -> list[MLAHostPool]:
    return [torch_pool, cuda_pool, ascend_pool]


def moe_methods() -> list[MoEMethod]:
    return [TorchMoEMethod(), GGMLMoEMethod(), AscendMoEMethod(), AscendW8A8DynamicMoEMethod()]


def created_pools() -> list[tuple[MLADevicePool, MLAHostPool]]:
    """What each backend's constructors return is usable as the protocols."""
    out: list[tuple[MLADevicePool, MLAHostPool]] = []
    cuda_dev = sgl_cuda.backend.create_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=8, layer_num=1
    )
    out.append((cuda_dev, sgl_cuda.backend.create_host_pool(cuda_dev, layout="layer_first")))
    ascend_dev = sgl_ascend.backend.create_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=8, layer_num=1
    )
    out.append(
        (ascend_dev, sgl_ascend.backend.create_host_pool(ascend_dev, layout="page_first_kv_split"))
    )
    return out


def mha_pools(
    torch_device: sgl_core.backend.PerLayerMHADevicePool,
    torch_host: sgl_core.backend.MHATokenHostPool,
) -> tuple[MHADevicePool, MHAHostPool]:
    """The torch backend's MHA classes satisfy the MHA protocols."""
    return torch_device, torch_host


def created_mha_pools() -> list[tuple[MHADevicePool, MHAHostPool]]:
    """Every backend's MHA factories return the MHA protocols (create_host_pool's overload)."""
    out: list[tuple[MHADevicePool, MHAHostPool]] = []
    for backend in backends():
        dev = backend.create_mha_device_pool(
            size=8, page_size=4, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=1
        )
        out.append((dev, backend.create_host_pool(dev, layout="page_first")))
    return out
