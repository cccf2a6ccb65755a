"""The kind layers of the host-pool base: how an MLA or MHA device pool's spec is read
(docs/design.md section 5, "One host pool, one mover per io")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sgl_core.errors import PoolMismatchError
from sgl_core.kv._spec import KVSpec, MHADims, MHAShape, MLAShape
from sgl_core.kv.device._engine_views import as_device_pool, as_mha_device_pool
from sgl_core.kv.device._indexer import indexer_of, mla_pool_spec
from sgl_core.kv.host._host_pool import HostPoolBase
from sgl_core.kv.protocols._kv_protocols import MHADevicePool, MLADevicePool

__all__ = ["MHAHostPoolBase", "MLAHostPoolBase"]

ShapeT = TypeVar("ShapeT", MLAShape, MHAShape)


def _read_shape(
    shape: Callable[..., ShapeT], device_pool: object, kind: str, names: tuple[str, ...]
) -> ShapeT:
    """``shape`` of ``device_pool``'s attributes ``names``; a pool without one is refused."""
    try:
        return shape(*(getattr(device_pool, n) for n in names))
    except AttributeError as exc:
        raise PoolMismatchError(f"device_pool is not an {kind} device pool: {exc}") from None


class MLAHostPoolBase(HostPoolBase[MLADevicePool, MLAShape]):
    """Common behaviour of MLA host pools (see ``sgl_core.MLAHostPool``)."""

    def _as_device_pool(self, device_pool: MLADevicePool) -> MLADevicePool:
        # The same view create_host_pool made: SGLang's pool moves its own bytes.
        return as_device_pool(device_pool)

    def _read_shape(self, device_pool: MLADevicePool) -> MLAShape:
        names = ("layer_num", "kv_lora_rank", "qk_rope_head_dim", "dtype", "kv_cache_dim")
        return _read_shape(MLAShape, device_pool, "MLA", names)

    def _read_spec(self, device_pool: MLADevicePool) -> KVSpec:
        return mla_pool_spec(self.shape, indexer_of(device_pool))

    @property
    def kv_cache_dim(self) -> int:
        return self.shape.kv_cache_dim


class MHAHostPoolBase(HostPoolBase[MHADevicePool, MHAShape], MHADims):
    """Common behaviour of MHA host pools (see ``sgl_core.MHAHostPool``)."""

    def _as_device_pool(self, device_pool: MHADevicePool) -> MHADevicePool:
        # The same view create_host_pool made: SGLang's pool moves its own bytes.
        return as_mha_device_pool(device_pool)

    def _read_shape(self, device_pool: MHADevicePool) -> MHAShape:
        names = ("layer_num", "head_num", "head_dim", "v_head_dim", "dtype")
        return _read_shape(MHAShape, device_pool, "MHA", names)

    def _read_spec(self, device_pool: MHADevicePool) -> KVSpec:
        return self.shape.spec
