"""The Ascend MHA / GQA pools, as returned and as classes, satisfy the MHA protocols.

Type-checked only (the runtime behaviour is in packages/ascend/tests); a
protocol change the Ascend MHA pools do not follow fails ``mypy --strict`` here.
"""

from __future__ import annotations

import torch

import sgl_ascend
from sgl_core import MHADevicePool, MHAHostPool


def classes(
    device_pool: sgl_ascend.AscendMHADevicePool, host_pool: sgl_ascend.AscendMHAHostPool
) -> tuple[MHADevicePool, MHAHostPool]:
    return device_pool, host_pool


def created() -> tuple[MHADevicePool, MHAHostPool]:
    dev = sgl_ascend.backend.create_mha_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=1
    )
    host = sgl_ascend.backend.create_host_pool(dev, layout="page_first_kv_split")
    host.load_to_device_per_layer(dev, torch.arange(4), torch.arange(4), 0, "kernel_ascend")
    k, v = dev.get_kv_buffer(0, torch.arange(4))
    dev.set_kv_buffer(0, torch.arange(4), k, v)
    return dev, host
