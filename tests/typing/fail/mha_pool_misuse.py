"""Engine code that mixes up MHA and MLA pools: each marked line must be rejected.

Every ``# E: <code>`` comment is an error mypy --strict must report on that
line with that code (tests/test_typing.py matches them exactly, both ways).
"""

from __future__ import annotations

import torch

import sgl_core
from sgl_core import MHADevicePool, MHAHostPool, MLADevicePool, MLAHostPool


def mixed_kinds(
    mha_host: MHAHostPool, mha_dev: MHADevicePool, mla_dev: MLADevicePool, idx: torch.Tensor
) -> None:
    mha_host.backup_from_device_all_layer(mla_dev, idx, idx, "direct")  # E: arg-type
    mha_host.load_to_device_per_layer(mla_dev, idx, idx, 0, "direct")  # E: arg-type
    mha_host.load_to_device_per_layer(mha_dev, idx, idx, "0", "direct")  # E: arg-type
    print(mha_dev.kv_lora_rank)  # E: attr-defined
    print(mha_dev.k_data_ptrs)  # E: attr-defined
    mha_dev.set_kv_buffer(0, idx, idx)  # E: call-arg
    k: torch.Tensor = mha_dev.get_kv_buffer(0, idx)  # E: assignment


def backend_calls(backend: sgl_core.Backend) -> None:
    dev = backend.create_mha_device_pool(size=8, page_size=4, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=1)
    wrong: MLAHostPool = backend.create_host_pool(dev, layout="page_head")  # E: assignment
    backend.create_mha_device_pool(size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, layer_num=1)  # E: call-arg
    backend.create_mha_device_pool(size=8, page_size=4, dtype=torch.bfloat16, head_num="8", head_dim=8, layer_num=1)  # E: arg-type
    pairs: dict[str, str] = backend.supported_mha_pairs  # E: assignment
