"""An engine's L2 controller for an MHA/GQA model, typed against the sgl_core protocols only.

The backend comes from ``sgl_core.get_backend()``; ``create_mha_device_pool``
gives an ``MHADevicePool`` and ``create_host_pool`` (overloaded on the device
pool's kind) an ``MHAHostPool``, with no cast. ``mypy --strict`` must accept
it unchanged (tests/test_typing.py); ``demo()`` also runs it (CPU, torch).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import sgl_core
from sgl_core import Backend, HostLayout, IOBackend, MHADevicePool, MHAHostPool


def pick_mha_layout(backend: Backend) -> tuple[HostLayout, IOBackend] | None:
    """A page-granular MHA layout when the backend has one, with its default io."""
    pairs = backend.supported_mha_pairs
    if not pairs:
        return None
    for layout in (HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD, *sorted(pairs, key=str)):
        if layout in pairs:
            return layout, backend.default_mha_io(layout)
    return None


class MHAHostCacheController:
    """Backs MHA device pages up to host memory and loads them back layer by layer."""

    def __init__(self, backend: Backend, device_pool: MHADevicePool) -> None:
        chosen = pick_mha_layout(backend)
        if chosen is None:
            raise RuntimeError(f"backend {backend.name} has no MHA host pools")
        layout, self.io_backend = chosen
        self.device_pool = device_pool
        self.host_pool: MHAHostPool = backend.create_host_pool(device_pool, layout=layout)

    def write_back(self, device_indices: torch.Tensor) -> torch.Tensor | None:
        host_indices = self.host_pool.alloc(int(device_indices.numel()))
        if host_indices is not None:
            self.host_pool.backup_from_device_all_layer(
                self.device_pool, host_indices, device_indices, self.io_backend
            )
        return host_indices

    def load_back(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> Iterator[int]:
        for layer_id in range(self.device_pool.layer_num):
            self.host_pool.load_to_device_per_layer(
                self.device_pool, host_indices, device_indices, layer_id, self.io_backend
            )
            yield layer_id

    def heads_per_page(self) -> int:
        return self.host_pool.head_num * self.host_pool.page_size


def demo() -> None:
    backend = sgl_core.get_backend("torch")
    page_size, layer_num = 4, 2
    dev = backend.create_mha_device_pool(
        size=16, page_size=page_size, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2
    )
    loc = torch.arange(4, 12, dtype=torch.int64)
    written = []
    for layer_id in range(layer_num):
        k = torch.randn(8, 2, 8).to(dev.dtype)
        v = torch.randn(8, 2, 8).to(dev.dtype)
        dev.set_kv_buffer(layer_id, loc, k, v)
        written.append((k, v))
    controller = MHAHostCacheController(backend, dev)
    host_indices = controller.write_back(loc)
    assert host_indices is not None
    target = torch.arange(12, 20, dtype=torch.int64)
    assert list(controller.load_back(host_indices, target)) == [0, 1]
    for layer_id, (k, v) in enumerate(written):
        got_k, got_v = dev.get_kv_buffer(layer_id, target)
        assert torch.equal(got_k, k) and torch.equal(got_v, v)
    assert controller.heads_per_page() == 8
