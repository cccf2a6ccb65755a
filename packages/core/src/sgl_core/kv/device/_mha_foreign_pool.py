"""An engine's own MHA device pool (SGLang's ``MHATokenToKVPool``), normalized at our boundary.

SGLang's MHA pool has what our MHA host pools read (sizes, heads, head
dims, per-layer ``k_buffer`` / ``v_buffer`` lists in the default NHD layout)
but its ``device`` is a ``str`` and its KV accessors take attention-layer
objects. ``sgl_core.kv.device._engine_views.as_mha_device_pool`` returns a cached view whose
``device`` is
a ``torch.device`` and whose accessors follow ``MHADevicePool``; the view
shares the engine's lists, so transfers move the engine's own tensors. The
dtype reported is the one the engine means (SGLang's ``dtype``, e.g.
``float8_e5m2``, not its ``uint8`` ``store_dtype``); K and V layers are then
shown as same-storage views of it, so the flavour is part of the host pool's
page format. Other physical layouts (HND,
page-major) have other ``k_buffer`` shapes and are refused by the host pool's
shape check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sgl_core.kv._validation import check_index_tensor, check_value_rows
from sgl_core.kv.device._foreign_pool import EngineView, engine_dtype, meant_layers
from sgl_core.kv.protocols._kv_protocols import MHADevicePool
from sgl_core.transfer.copy._copy import byte_view

__all__ = ["ForeignMHADevicePool"]


class ForeignMHADevicePool(EngineView):
    """An engine's per-layer MHA device pool seen through ``MHADevicePool``."""

    _kind = "MHA"
    _lists = ("k_buffer", "v_buffer")

    @property
    def k_buffer(self) -> list[torch.Tensor]:
        layers: list[torch.Tensor] = self._pool.k_buffer  # the engine's own list
        return meant_layers(layers, self.dtype)

    @property
    def v_buffer(self) -> list[torch.Tensor]:
        layers: list[torch.Tensor] = self._pool.v_buffer
        return meant_layers(layers, self.dtype)

    @property
    def head_num(self) -> int:
        return int(self._pool.head_num)

    @property
    def head_dim(self) -> int:
        return int(self._pool.head_dim)

    @property
    def v_head_dim(self) -> int:
        return int(getattr(self._pool, "v_head_dim", None) or self._pool.head_dim)

    @property
    def dtype(self) -> torch.dtype:
        return engine_dtype(self._pool, self._pool.k_buffer)

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        i = self._layer(layer_id)
        n = check_index_tensor(loc, "loc").numel()
        # As our own pools: rows of exactly the pool's dtype and shape, never
        # converted; both checked before any byte moves.
        for name, tensor, dim in (
            ("cache_k", cache_k, self.head_dim),
            ("cache_v", cache_v, self.v_head_dim),
        ):
            check_value_rows(tensor, name, (n, self.head_num, dim), self.dtype)
        # fp8 has no index kernels everywhere: written as bytes (same storage).
        byte_view(self.k_buffer[i])[loc] = byte_view(cache_k)
        byte_view(self.v_buffer[i])[loc] = byte_view(cache_v)

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._layer(layer_id)
        k = byte_view(self.k_buffer[i])[loc].view(self.dtype)
        return k, byte_view(self.v_buffer[i])[loc].view(self.dtype)


if TYPE_CHECKING:  # static conformance of the view
    _check: MHADevicePool = ForeignMHADevicePool(object())
