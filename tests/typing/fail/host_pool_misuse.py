"""Engine code that misuses the pool protocols: each marked line must be rejected.

Every ``# E: <code>`` comment is an error mypy --strict must report on that
line with that code (tests/test_typing.py matches them exactly, both ways).
"""

from __future__ import annotations

import torch

import sgl_core
from sgl_core import IOBackend, MLADevicePool, MLAHostPool


def write_back(host: MLAHostPool, dev: MLADevicePool, idx: torch.Tensor) -> None:
    host.backup_from_device_all_layer(dev, "0,1,2,3", idx, "direct")  # E: arg-type
    host.backup_from_device_all_layer(dev, idx, [4, 5, 6, 7], "direct")  # E: arg-type
    host.backup_from_device_all_layer(dev, idx, idx, 1)  # E: arg-type
    host.backup_from_device_all_layer(host, idx, idx, IOBackend.DIRECT)  # E: arg-type
    host.backup_all_layers(dev, idx, idx, "direct")  # E: attr-defined
    done = host.backup_from_device_all_layer(dev, idx, idx, "direct")  # E: func-returns-value
    host.backup_from_device_all_layer(dev, idx, idx)  # E: call-arg


def load(host: MLAHostPool, dev: MLADevicePool, idx: torch.Tensor) -> None:
    host.load_to_device_per_layer(dev, idx, idx, "3", "direct")  # E: arg-type
    host.load_to_device_per_layer(dev, idx, idx, layer=3, io_backend="direct")  # E: call-arg
    for layer_id in range(dev.layer_num):
        host.load_to_device_per_layer(dev, idx, idx, layer_id, io_backend=None)  # E: arg-type


def upstream_bug(dev: MLADevicePool) -> None:
    # Reading a CUDA-only attribute through the protocol: the upstream crash on NPU.
    print(dev.data_ptrs.numel())  # E: attr-defined


def accounting(host: MLAHostPool) -> int:
    slots = host.alloc(64)
    host.free(slots)  # E: arg-type
    freed: str = host.free(torch.arange(4))  # E: assignment
    return host.available_size  # E: return-value


def backend_calls() -> None:
    backend = sgl_core.get_backend(3)  # E: arg-type
    dev = backend.create_device_pool(size=8, page_size=4, dtype="bf16", kv_lora_rank=8, qk_rope_head_dim=8, layer_num=1)  # E: arg-type
    # create_host_pool is overloaded on the device pool's kind (MLA or MHA):
    # a bad argument matches no overload.
    backend.create_host_pool(dev, layout="layer_first", io_backend=1)  # E: call-overload
    backend.create_host_pool(dev, "layer_first")  # E: call-overload
