"""A HiCache-style L2 controller, written the way a serving engine integrates sgl.

It only knows the protocols: the backend comes from ``sgl_core.get_backend()``,
the pools are typed as ``MLADevicePool`` / ``MLAHostPool``, and write-back and
per-layer load go through the protocol methods. ``mypy --strict`` must accept
it unchanged (tests/test_typing.py); ``demo()`` also runs it (CPU, torch backend).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import sgl_core
from sgl_core import Backend, HostLayout, IOBackend, MLADevicePool, MLAHostPool


def pick_layout(backend: Backend) -> tuple[HostLayout, IOBackend]:
    """The first (layout, io backend) pair the backend builds, in a stable order."""
    pairs = backend.supported_pairs
    layout = sorted(pairs, key=str)[0]
    io_backend = sorted(pairs[layout], key=str)[0]
    return layout, io_backend


class HostCacheController:
    """Backs device pages up to host memory and loads them back layer by layer."""

    def __init__(self, backend: Backend, device_pool: MLADevicePool) -> None:
        layout, io_backend = pick_layout(backend)
        self.device_pool: MLADevicePool = device_pool
        self.io_backend: IOBackend = io_backend
        self.host_pool: MLAHostPool = backend.create_host_pool(
            device_pool, layout=layout, host_to_device_ratio=2.0, io_backend=io_backend
        )

    def write_back(self, device_indices: torch.Tensor) -> torch.Tensor | None:
        """Copy every layer of ``device_indices`` to freshly allocated host slots."""
        host_indices = self.host_pool.alloc(int(device_indices.numel()))
        if host_indices is None:
            return None
        self.host_pool.backup_from_device_all_layer(
            self.device_pool, host_indices, device_indices, self.io_backend
        )
        return host_indices

    def load_back(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> Iterator[int]:
        """Load one layer per step, so the caller can overlap it with compute."""
        for layer_id in range(self.device_pool.layer_num):
            self.host_pool.load_to_device_per_layer(
                self.device_pool, host_indices, device_indices, layer_id, self.io_backend
            )
            yield layer_id

    def evict(self, host_indices: torch.Tensor) -> int:
        return self.host_pool.free(host_indices)

    def page_for_l3(self, host_index: int) -> torch.Tensor:
        return self.host_pool.get_data_page(host_index, flat=True)


def page_run(first_page: int, pages: int, page_size: int) -> torch.Tensor:
    """Token indices of ``pages`` whole pages starting at ``first_page``."""
    start = first_page * page_size
    return torch.arange(start, start + pages * page_size, dtype=torch.int64)


def demo() -> None:
    """Write two pages back, wipe them on the device, load them back per layer."""
    backend = sgl_core.get_backend()
    page_size, layer_num = 4, 3
    device_pool = backend.create_device_pool(
        size=32,
        page_size=page_size,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=layer_num,
        device="cpu",
    )
    device_indices = page_run(1, 2, page_size)
    n = int(device_indices.numel())
    written: list[tuple[torch.Tensor, torch.Tensor]] = []
    for layer_id in range(layer_num):
        nope = torch.randn(n, 1, device_pool.kv_lora_rank).to(device_pool.dtype)
        rope = torch.randn(n, 1, device_pool.qk_rope_head_dim).to(device_pool.dtype)
        device_pool.set_mla_kv_buffer(layer_id, device_indices, nope, rope)
        written.append((nope, rope))

    controller = HostCacheController(backend, device_pool)
    host_indices = controller.write_back(device_indices)
    assert host_indices is not None

    target = page_run(4, 2, page_size)
    loaded = list(controller.load_back(host_indices, target))
    assert loaded == list(range(layer_num))
    for layer_id, (nope, rope) in enumerate(written):
        got_nope, got_rope = device_pool.get_mla_kv_buffer(layer_id, target)
        assert torch.equal(got_nope, nope)
        assert torch.equal(got_rope, rope)
    assert controller.page_for_l3(int(host_indices[0])).dim() == 1
    assert controller.evict(host_indices) == n
