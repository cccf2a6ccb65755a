"""CUDA MHA device pool: one K and one V tensor per layer plus their pointer tables."""

from __future__ import annotations

import torch

from sgl_core.backend import PerLayerMHADevicePool
from sgl_core.errors import PoolMismatchError
from sgl_cuda._device_pool import resolve_device

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

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        v_head_dim: int | None = None,
    ) -> None:
        super().__init__(
            size=size,
            page_size=page_size,
            dtype=dtype,
            head_num=head_num,
            head_dim=head_dim,
            layer_num=layer_num,
            device=resolve_device(device),
            v_head_dim=v_head_dim,
        )
        self._ptr_lists = (
            [t.data_ptr() for t in self.k_buffer],
            [t.data_ptr() for t in self.v_buffer],
        )
        self._tables = tuple(
            torch.tensor(ptrs, dtype=torch.uint64, device=self.device) for ptrs in self._ptr_lists
        )

    @property
    def k_data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``k_buffer[i].data_ptr()`` on the pool's device."""
        self.sync_data_ptrs()
        return self._tables[0]

    @property
    def v_data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``v_buffer[i].data_ptr()`` on the pool's device."""
        self.sync_data_ptrs()
        return self._tables[1]

    def pointer_table(self, device_name: str) -> torch.Tensor:
        """The address table of the layers in ``device_name`` (``k_buffer`` or ``v_buffer``)."""
        self.sync_data_ptrs()
        return self._tables[("k_buffer", "v_buffer").index(device_name)]

    def sync_data_ptrs(self) -> None:
        """Check replaced layers and refresh both tables in place if any address changed."""
        for c, (name, layers, dim) in enumerate(
            (
                ("k_buffer", self.k_buffer, self.head_dim),
                ("v_buffer", self.v_buffer, self.v_head_dim),
            )
        ):
            if len(layers) != self.layer_num:
                raise PoolMismatchError(
                    f"{name} must hold {self.layer_num} layer tensors, got {len(layers)}"
                )
            current = [t.data_ptr() if isinstance(t, torch.Tensor) else 0 for t in layers]
            if current == self._ptr_lists[c]:
                continue
            expected = (self.slot_count, self.head_num, dim)
            for i, t in enumerate(layers):
                if not (
                    isinstance(t, torch.Tensor)
                    and tuple(t.shape) == expected
                    and t.dtype == self.dtype
                    and t.device == self.device
                    and t.is_contiguous()
                ):
                    raise PoolMismatchError(
                        f"{name}[{i}] must be a contiguous {expected} {self.dtype} tensor "
                        f"on {self.device}"
                    )
            self._tables[c].copy_(torch.tensor(current, dtype=torch.uint64))
            self._ptr_lists[c][:] = current

    @property
    def device(self) -> torch.device:
        return self._device
