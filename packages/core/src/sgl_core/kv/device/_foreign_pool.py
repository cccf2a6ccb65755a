"""Device pools built by a serving engine (MLA and MHA), normalized at our boundary.

SGLang's pools report ``device`` as a ``str`` and take attention-layer
objects in their accessors; these views (made by ``_engine_views``) follow
our protocols over the engine's own per-layer lists, so transfers move the
engine's tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from sgl_core.errors import PoolMismatchError, ShapeMismatchError
from sgl_core.kv._validation import check_index_tensor, check_value_rows
from sgl_core.kv.protocols._kv_protocols import MHADevicePool, MLADevicePool
from sgl_core.transfer.copy._copy import byte_view

__all__ = [
    "EngineView",
    "ForeignMHADevicePool",
    "ForeignMLADevicePool",
    "engine_dtype",
    "meant_layers",
]


def engine_dtype(pool: Any, layers: list[torch.Tensor]) -> torch.dtype:
    """The element type ``pool`` means: its ``dtype`` when that is a same-width
    reading of the stored one (SGLang's fp8 over ``uint8``), else the stored one."""
    stored = layers[0].dtype
    meant = getattr(pool, "dtype", None)
    if isinstance(meant, torch.dtype) and meant != stored and meant.itemsize == stored.itemsize:
        return meant
    return stored


def meant_layers(layers: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """``layers`` itself when stored as ``dtype``, else same-storage views of ``dtype``.

    Views are made on every call (cheap, no copy), so a layer the engine
    replaced or re-pointed (``Tensor.set_``) is seen as it is now.
    """
    if all(t.dtype == dtype for t in layers):
        return layers
    return [t.view(dtype) for t in layers]


class EngineView:
    """What a view of an engine's per-layer pool shares, whatever its kind: the
    wrapped pool, its sizes and its ``device`` as a ``torch.device``."""

    _kind: ClassVar[str]
    #: The engine pool's per-layer lists the view needs (non-empty, equally long).
    _lists: ClassVar[tuple[str, ...]]

    def __init__(self, pool: Any) -> None:
        try:
            self._device = torch.device(pool.device)
            lists = [getattr(pool, name) for name in self._lists]
        except (AttributeError, TypeError, RuntimeError) as exc:
            raise PoolMismatchError(
                f"{type(pool).__name__} is not a per-layer {self._kind} device pool: {exc}"
            ) from None
        if not all(isinstance(x, list) and x for x in lists) or len(set(map(len, lists))) > 1:
            raise PoolMismatchError(
                f"{type(pool).__name__}.{'/'.join(self._lists)} must be non-empty lists of "
                "layer tensors"
            )
        self._pool = pool

    @property
    def wrapped(self) -> Any:
        """The engine's pool object."""
        return self._pool

    @property
    def size(self) -> int:
        return int(self._pool.size)

    @property
    def page_size(self) -> int:
        return int(self._pool.page_size)

    @property
    def layer_num(self) -> int:
        return int(self._pool.layer_num)

    @property
    def device(self) -> torch.device:
        return self._device

    def _layer(self, layer_id: int) -> int:
        """``layer_id`` when it is an int in ``[0, layer_num)``, else ``PoolMismatchError``."""
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):
            raise PoolMismatchError(f"layer_id must be an int, got {type(layer_id).__name__}")
        if not 0 <= layer_id < self.layer_num:
            raise PoolMismatchError(f"layer_id={layer_id} is outside [0, {self.layer_num})")
        return layer_id


class ForeignMLADevicePool(EngineView):
    """An engine's per-layer MLA device pool seen through ``MLADevicePool``."""

    _kind = "MLA"
    _lists = ("kv_buffer",)

    @property
    def kv_buffer(self) -> list[torch.Tensor]:
        # The engine's own list (not a copy): a layer it replaces is seen here too.
        layers: list[torch.Tensor] = self._pool.kv_buffer
        return meant_layers(layers, engine_dtype(self._pool, layers))

    @property
    def kv_lora_rank(self) -> int:
        return int(self._pool.kv_lora_rank)

    @property
    def qk_rope_head_dim(self) -> int:
        return int(self._pool.qk_rope_head_dim)

    @property
    def kv_cache_dim(self) -> int:
        return int(self._pool.kv_cache_dim)

    @property
    def dtype(self) -> torch.dtype:
        # The dtype the engine means (SGLang's ``dtype``), not its ``store_dtype``.
        return engine_dtype(self._pool, self._pool.kv_buffer)

    def _rows(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[self._layer(layer_id)]

    def set_mla_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        rows = self._rows(layer_id)
        n = check_index_tensor(loc, "loc").numel()
        # As our own pools: rows of exactly the pool's dtype and shape, never
        # converted; checked before any byte moves.
        check_value_rows(cache_k_nope, "cache_k_nope", (n, 1, self.kv_lora_rank), self.dtype)
        check_value_rows(cache_k_rope, "cache_k_rope", (n, 1, self.qk_rope_head_dim), self.dtype)
        if rows.shape[-1] != self.kv_lora_rank + self.qk_rope_head_dim:
            raise ShapeMismatchError(
                f"rows of {rows.shape[-1]} elements are not kv_lora_rank + qk_rope_head_dim "
                "(a packed pool): write them with the engine's own calls"
            )
        # fp8 has no index kernels everywhere: written as bytes (same storage).
        byte_view(rows)[loc] = byte_view(torch.cat([cache_k_nope, cache_k_rope], dim=-1))

    def get_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = byte_view(self._rows(layer_id))[loc].view(self.dtype)
        rank = self.kv_lora_rank
        return rows[..., :rank].clone(), rows[..., rank:].clone()


class ForeignMHADevicePool(EngineView):
    """An engine's per-layer MHA device pool seen through ``MHADevicePool``.

    K and V layers are shown as same-storage views of the dtype the engine
    means, in the default NHD layout; other physical layouts (HND,
    page-major) are refused by the host pool's shape check.
    """

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
        n, heads = check_index_tensor(loc, "loc").numel(), self.head_num
        # As our own pools: rows of exactly the pool's dtype and shape, never
        # converted; both checked before any byte moves.
        check_value_rows(cache_k, "cache_k", (n, heads, self.head_dim), self.dtype)
        check_value_rows(cache_v, "cache_v", (n, heads, self.v_head_dim), self.dtype)
        # fp8 has no index kernels everywhere: written as bytes (same storage).
        byte_view(self.k_buffer[i])[loc] = byte_view(cache_k)
        byte_view(self.v_buffer[i])[loc] = byte_view(cache_v)

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._layer(layer_id)
        k = byte_view(self.k_buffer[i])[loc].view(self.dtype)
        return k, byte_view(self.v_buffer[i])[loc].view(self.dtype)


if TYPE_CHECKING:  # static conformance of the views
    _check: MLADevicePool = ForeignMLADevicePool(object())
    _check_mha: MHADevicePool = ForeignMHADevicePool(object())
