"""The two kinds' device-pool geometry and the engine constructor every backend's pools share.

The constructor resolves ``device`` (the backend's ``_pool_device``), checks
geometry and indexer, then calls the backend's ``_allocate``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from typing_extensions import Unpack

from sgl_core.errors import PoolMismatchError
from sgl_core.kv._spec import MHADims, MHAShape, MLAShape
from sgl_core.kv.device._indexer import IndexerConfig, check_indexer
from sgl_core.kv.device._slot_geometry import SlotGeometry, check_pool_geometry
from sgl_core.kv.protocols._kv_protocols import MHAGeometryArgs, MLAGeometryArgs

__all__ = ["MHADevicePoolBase", "MHAPoolGeometry", "MLADevicePoolBase", "MLAPoolGeometry"]


class MLAPoolGeometry(SlotGeometry):
    """Geometry every MLA device pool reports (the ``MLADevicePool`` properties)."""

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


class MLADevicePoolBase(MLAPoolGeometry):
    """The engine constructor of an MLA (or DSA) device pool; storage is ``_allocate``'s."""

    def __init__(
        self,
        *,
        device: str | torch.device | None = None,
        index_head_dim: int | None = None,
        indexer_layer_ids: Iterable[int] | None = None,
        with_index_k_scale: bool = False,
        **geometry: Unpack[MLAGeometryArgs],
    ) -> None:
        super().__init__(device=self._pool_device(device), **geometry)
        cfg = check_indexer(index_head_dim, indexer_layer_ids, with_index_k_scale, self.layer_num)
        self._allocate(cfg)

    def _allocate(self, indexer: IndexerConfig | None) -> None:
        """Set the pool's spec and buffers (``indexer``: the checked indexer arguments)."""
        raise NotImplementedError

    def _split_rows_error(self, what: str) -> PoolMismatchError:
        """The refusal of a split accessor (``what``) on a pool of packed rows."""
        return PoolMismatchError(
            f"{what}: this pool's rows are {self.kv_cache_dim} packed {self.dtype} elements "
            f"(kv_cache_dim given), not kv_lora_rank={self.kv_lora_rank} + "
            f"qk_rope_head_dim={self.qk_rope_head_dim} values; use set_kv_rows / get_kv_rows"
        )


class MHAPoolGeometry(MHADims, SlotGeometry):
    """Geometry every MHA device pool reports (the ``MHADevicePool`` properties)."""

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


class MHADevicePoolBase(MHAPoolGeometry):
    """The engine constructor of an MHA/GQA device pool; storage is ``_allocate``'s."""

    def __init__(
        self, *, device: str | torch.device | None = None, **geometry: Unpack[MHAGeometryArgs]
    ) -> None:
        super().__init__(device=self._pool_device(device), **geometry)
        self._allocate()

    def _allocate(self) -> None:
        """Set the pool's spec and buffers."""
        raise NotImplementedError
