"""CUDA MHA device pool: one K and one V tensor per layer plus their pointer tables."""

from __future__ import annotations

import torch

from sgl_core.backend import PerLayerMHADevicePool
from sgl_cuda._device_pool import LayerTables, resolve_device

__all__ = ["CudaMHADevicePool"]


class CudaMHADevicePool(PerLayerMHADevicePool):
    """Per-layer MHA/GQA KV cache on a CUDA device, with pointer tables for all-layer kernels.

    ``k_buffer[layer]`` is ``(size + page_size, head_num, head_dim)`` and
    ``v_buffer[layer]`` ``(size + page_size, head_num, v_head_dim)``, each its
    own allocation (SGLang's ``MHATokenToKVPool`` layout); ``k_data_ptrs`` and
    ``v_data_ptrs`` are ``torch.uint64`` tables of their addresses on the
    pool's device. A layer replaced in the lists (or re-pointed with ``set_``)
    is checked and the tables updated in place the next time they are read.
    """

    layers_in_one_allocation = False

    def _pool_device(self, device: str | torch.device | None) -> torch.device:
        return resolve_device(device)

    def _allocate(self) -> None:
        super()._allocate()
        shapes = {"k_buffer": (self.slot_count, self.head_num, self.head_dim)}
        shapes["v_buffer"] = (self.slot_count, self.head_num, self.v_head_dim)
        self._tables = LayerTables(self, shapes, self.device)

    @property
    def k_data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``k_buffer[i].data_ptr()`` on the pool's device."""
        return self._tables.table("k_buffer")

    @property
    def v_data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``v_buffer[i].data_ptr()`` on the pool's device."""
        return self._tables.table("v_buffer")

    def pointer_table(self, device_name: str) -> torch.Tensor:
        """The address table of the layers in ``device_name`` (``k_buffer`` or ``v_buffer``)."""
        return self._tables.table(device_name)

    def sync_data_ptrs(self) -> None:
        """Check replaced layers and refresh both tables in place if any address changed."""
        for name in ("k_buffer", "v_buffer"):
            self._tables.sync(name)

    @property
    def device(self) -> torch.device:
        return self._device
