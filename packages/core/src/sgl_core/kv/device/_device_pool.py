"""The per-layer device pools of the torch backend (and, subclassed, cuda), both kinds.

``MLAPoolGeometry`` / ``MHAPoolGeometry`` are the geometry every device pool
of a kind reports (backend authors subclass them); ``PerLayerMLADevicePool``
and ``PerLayerMHADevicePool`` keep their spec's components as per-layer
tensors (``sgl_core.kv.device._device_rows``) and add the kind's engine accessors:
``set_mla_kv_buffer`` / ``get_mla_kv_buffer`` and the raw-row ``set_kv_rows``
/ ``get_kv_rows`` (MLA, with the DSA indexer's ``set_index_k_buffer``), and
``set_kv_buffer`` / ``get_kv_buffer`` (MHA: K and V rows, SGLang's
``MHATokenToKVPool`` field names).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from sgl_core.errors import PoolMismatchError
from sgl_core.kv._shapes import MHAShape, MLAShape
from sgl_core.kv._spec import mha_spec, mla_spec
from sgl_core.kv._validation import check_layer_id, check_value_rows
from sgl_core.kv.device._device_rows import PerLayerRows, check_raw_rows
from sgl_core.kv.device._devices import usable_device
from sgl_core.kv.device._indexer import IndexerRows, check_indexer
from sgl_core.kv.device._slot_geometry import SlotGeometry, check_pool_geometry
from sgl_core.kv.protocols._kv_protocols import MHADevicePool
from sgl_core.transfer.copy._copy import byte_view

__all__ = ["MHAPoolGeometry", "MLAPoolGeometry", "PerLayerMHADevicePool", "PerLayerMLADevicePool"]


class MLAPoolGeometry(SlotGeometry):
    """Geometry every MLA device pool reports (the ``MLADevicePool`` properties).

    Backend authors subclass it, call ``__init__`` first, then allocate their
    buffers; override ``device`` to report the buffers' own device.
    """

    shape: MLAShape

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: torch.device,
        kv_cache_dim: int | None = None,
    ) -> None:
        check_pool_geometry(size, page_size)
        self.shape = MLAShape(layer_num, kv_lora_rank, qk_rope_head_dim, dtype, kv_cache_dim)
        self._set_slots(size, page_size, device)

    @property
    def kv_lora_rank(self) -> int:
        return self.shape.kv_lora_rank

    @property
    def qk_rope_head_dim(self) -> int:
        return self.shape.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        return self.shape.kv_cache_dim


class PerLayerMLADevicePool(MLAPoolGeometry, PerLayerRows, IndexerRows):
    """``kv_buffer[layer]`` is a ``(size + page_size, 1, kv_cache_dim)`` tensor
    (``layers_in_one_allocation``: see ``sgl_core.kv.device._device_rows``).

    ``kv_cache_dim`` makes each row that many elements of ``dtype`` whatever
    the rank split (a packed row the engine quantizes itself, e.g. 656
    ``uint8`` for DeepSeek-V3.2's FP8 MLA): such rows are written and read
    with :meth:`set_kv_rows` / :meth:`get_kv_rows`, and the split accessors
    ``set_mla_kv_buffer`` / ``get_mla_kv_buffer`` raise ``PoolMismatchError``.
    ``index_head_dim`` (with ``indexer_layer_ids``, ``with_index_k_scale``)
    adds the sparse-attention indexer cache (``sgl_core.kv.device._indexer``).
    """

    kv_buffer: list[torch.Tensor]

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        kv_cache_dim: int | None = None,
        index_head_dim: int | None = None,
        indexer_layer_ids: Iterable[int] | None = None,
        with_index_k_scale: bool = False,
    ) -> None:
        super().__init__(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            layer_num=layer_num,
            device=usable_device(device),
            kv_cache_dim=kv_cache_dim,
        )
        self.indexer = cfg = check_indexer(
            index_head_dim, indexer_layer_ids, with_index_k_scale, layer_num
        )
        s = self.shape
        self.spec = mla_spec(
            layer_num,
            s.kv_lora_rank,
            s.qk_rope_head_dim,
            dtype,
            s.row_dim,
            index_head_dim=None if cfg is None else cfg.index_head_dim,
            indexer_layer_ids=() if cfg is None else cfg.layer_ids,
            with_index_k_scale=cfg is not None and cfg.with_scale,
        )
        self.index_k_buffer = None
        self.index_k_scale_buffer = None
        self._allocate_rows()  # kv_buffer, and index_k_buffer / index_k_scale_buffer

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_buffer[check_layer_id(layer_id, self.layer_num)]

    def set_mla_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
    ) -> None:
        loc = self._check_loc(layer_id, loc)
        self._check_split_rows("set_mla_kv_buffer")
        n = loc.numel()
        for name, tensor, dim in (
            ("cache_k_nope", cache_k_nope, self.kv_lora_rank),
            ("cache_k_rope", cache_k_rope, self.qk_rope_head_dim),
        ):
            check_value_rows(tensor, name, (n, 1, dim), self.dtype)
        # fp8 caches move as bytes (no fp8 index kernels).
        parts = [byte_view(t.to(self.device)) for t in (cache_k_nope, cache_k_rope)]
        byte_view(self.kv_buffer[layer_id]).index_copy_(0, loc, torch.cat(parts, dim=-1))

    def get_mla_kv_buffer(
        self, layer_id: int, loc: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self._check_loc(layer_id, loc)
        self._check_split_rows("get_mla_kv_buffer")
        rows = byte_view(self.kv_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        return rows[..., : self.kv_lora_rank], rows[..., self.kv_lora_rank :]

    def _check_split_rows(self, what: str) -> None:
        if self.shape.packed:
            raise PoolMismatchError(
                f"{what}: this pool's rows are {self.kv_cache_dim} packed {self.dtype} elements "
                f"(kv_cache_dim given), not kv_lora_rank={self.kv_lora_rank} + "
                f"qk_rope_head_dim={self.qk_rope_head_dim} values; use set_kv_rows / get_kv_rows"
            )

    # ------------------------------------------------------------- raw rows
    def set_kv_rows(self, layer_id: int, loc: torch.Tensor, rows: torch.Tensor) -> None:
        """Write raw ``(n, kv_cache_dim)`` rows of the pool's dtype at token ``loc``.

        The bytes land as given (no conversion): rows of another dtype or
        shape are ``PoolMismatchError``, before anything is written.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        loc = self._check_loc(layer_id, loc)
        check_raw_rows(rows, loc.numel(), self.kv_cache_dim, self.dtype)
        byte_view(self.kv_buffer[layer_id][:, 0]).index_copy_(
            0, loc, byte_view(rows.to(self.device).contiguous())
        )

    def get_kv_rows(self, layer_id: int, loc: torch.Tensor) -> torch.Tensor:
        """A copy of the raw ``(n, kv_cache_dim)`` rows at token ``loc``, of the pool's dtype."""
        loc = self._check_loc(layer_id, loc)
        return byte_view(self.kv_buffer[layer_id][:, 0]).index_select(0, loc).view(self.dtype)


class MHAPoolGeometry(SlotGeometry):
    """Geometry every MHA device pool reports (the ``MHADevicePool`` properties).

    Backend authors subclass it, call ``__init__`` first, then allocate their
    buffers; override ``device`` to report the buffers' own device.
    """

    shape: MHAShape

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: torch.device,
        v_head_dim: int | None = None,
    ) -> None:
        check_pool_geometry(size, page_size)
        v_dim = head_dim if v_head_dim is None else v_head_dim
        self.shape = MHAShape(layer_num, head_num, head_dim, v_dim, dtype)
        self._set_slots(size, page_size, device)

    @property
    def head_num(self) -> int:
        return self.shape.head_num

    @property
    def head_dim(self) -> int:
        return self.shape.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.shape.v_head_dim


class PerLayerMHADevicePool(MHAPoolGeometry, PerLayerRows):
    """``k_buffer[layer]`` / ``v_buffer[layer]``: one K and one V tensor per layer
    (``layers_in_one_allocation``: see ``sgl_core.kv.device._device_rows``)."""

    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]

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
            device=usable_device(device),
            v_head_dim=v_head_dim,
        )
        s = self.shape
        self.spec = mha_spec(layer_num, s.head_num, s.head_dim, s.v_head_dim, dtype)
        self._allocate_rows()  # k_buffer, v_buffer

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[check_layer_id(layer_id, self.layer_num)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[check_layer_id(layer_id, self.layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
    ) -> None:
        loc = self._check_loc(layer_id, loc)
        n = loc.numel()
        for name, tensor, dim in (
            ("cache_k", cache_k, self.head_dim),
            ("cache_v", cache_v, self.v_head_dim),
        ):
            check_value_rows(tensor, name, (n, self.head_num, dim), self.dtype)
        # fp8 caches move as bytes (no fp8 index kernels).
        for layers, tensor in ((self.k_buffer, cache_k), (self.v_buffer, cache_v)):
            rows = byte_view(tensor.to(self.device).contiguous())
            byte_view(layers[layer_id]).index_copy_(0, loc, rows)

    def get_kv_buffer(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self._check_loc(layer_id, loc)
        k = byte_view(self.k_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        v = byte_view(self.v_buffer[layer_id]).index_select(0, loc).view(self.dtype)
        return k, v


if TYPE_CHECKING:
    _pool: MHADevicePool = PerLayerMHADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
    )
