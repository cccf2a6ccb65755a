"""The kind layers of the host-pool base: how an MLA or MHA device pool's spec is read.

Everything else (sizes, checks, page formats, validation, dispatch) is
``HostPoolBase``'s and reads the spec. A kind layer adds the device-pool
view ``create_host_pool`` made, the kind's shape object (``MLAShape``,
``MHAShape``, engine-visible through ``pool.shape``) and the engine
accessors that name the kind's numbers (``kv_cache_dim``; ``head_num``,
``head_dim``, ``v_head_dim``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from sgl_core.errors import PoolMismatchError
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._shapes import MHAShape, MLAShape
from sgl_core.kv._spec import KVSpec, mha_spec
from sgl_core.kv.device._engine_views import as_device_pool, as_mha_device_pool
from sgl_core.kv.device._indexer import indexer_of, mla_pool_spec
from sgl_core.kv.host._host_pool import HostPoolBase
from sgl_core.kv.protocols._kv_protocols import MHADevicePool, MLADevicePool
from sgl_core.transfer._transfer import MoverFactory

__all__ = ["MHAHostPoolBase", "MLAHostPoolBase"]


class MLAHostPoolBase(HostPoolBase[MLADevicePool, MLAShape]):
    """Common behaviour of MLA host pools (see ``sgl_core.MLAHostPool``)."""

    #: Per host layout this class builds: each io backend it runs and its mover factory.
    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]]

    def _as_device_pool(self, device_pool: MLADevicePool) -> MLADevicePool:
        # The same view create_host_pool made: SGLang's pool moves its own bytes.
        return as_device_pool(device_pool)

    def _read_shape(self, device_pool: MLADevicePool) -> MLAShape:
        try:
            return MLAShape(
                device_pool.layer_num,
                device_pool.kv_lora_rank,
                device_pool.qk_rope_head_dim,
                device_pool.dtype,
                device_pool.kv_cache_dim,
            )
        except AttributeError as exc:
            raise PoolMismatchError(f"device_pool is not an MLA device pool: {exc}") from None

    def _read_spec(self, device_pool: MLADevicePool) -> KVSpec:
        return mla_pool_spec(self.shape, indexer_of(device_pool))

    @property
    def kv_cache_dim(self) -> int:
        return self.shape.kv_cache_dim


class MHAHostPoolBase(HostPoolBase[MHADevicePool, MHAShape]):
    """Common behaviour of MHA host pools (see ``sgl_core.MHAHostPool``)."""

    #: Per host layout this class builds: each io backend it runs and its mover factory.
    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]]

    def _as_device_pool(self, device_pool: MHADevicePool) -> MHADevicePool:
        # The same view create_host_pool made: SGLang's pool moves its own bytes.
        return as_mha_device_pool(device_pool)

    def _read_shape(self, device_pool: MHADevicePool) -> MHAShape:
        try:
            return MHAShape(
                device_pool.layer_num,
                device_pool.head_num,
                device_pool.head_dim,
                device_pool.v_head_dim,
                device_pool.dtype,
            )
        except AttributeError as exc:
            raise PoolMismatchError(f"device_pool is not an MHA device pool: {exc}") from None

    def _read_spec(self, device_pool: MHADevicePool) -> KVSpec:
        s = self.shape
        return mha_spec(s.layer_num, s.head_num, s.head_dim, s.v_head_dim, s.dtype)

    @property
    def head_num(self) -> int:
        return self.shape.head_num

    @property
    def head_dim(self) -> int:
        return self.shape.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.shape.v_head_dim
