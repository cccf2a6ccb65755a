"""The ``ascend`` backend object registered under entry-point group ``sgl.backends``.

``sgl_core.get_backend()`` picks it automatically only where an NPU is usable
(``is_available()``); ``sgl_core.get_backend("ascend")`` returns it anywhere,
and its pools then run on CPU tensors (``device=None`` resolves to CPU when
there is no NPU), which is how its tests and the conformance suite run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from sgl_ascend import _npu
from sgl_ascend._device_pool import AscendMLADevicePool
from sgl_ascend._host_pool import AscendMLAHostPool
from sgl_core import HostLayout, IOBackend, MLADevicePool

__all__ = ["AscendBackend", "backend"]


class AscendBackend:
    """Backend ``"ascend"``: contiguous multi-layer pools and ``kernel_ascend`` transfers."""

    name = "ascend"

    @property
    def supported_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        return AscendMLAHostPool.supported_pairs

    def is_available(self) -> bool:
        """True only when ``torch_npu`` imports and an NPU is visible."""
        return _npu.npu_available()

    def create_device_pool(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        index_head_dim: int | None = None,
        indexer_layer_ids: Iterable[int] | None = None,
        with_index_k_scale: bool = False,
    ) -> AscendMLADevicePool:
        """A pool of 5-D layer-major tensors; pass ``index_head_dim`` for an indexer cache."""
        return AscendMLADevicePool(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            layer_num=layer_num,
            device=device,
            index_head_dim=index_head_dim,
            indexer_layer_ids=indexer_layer_ids,
            with_index_k_scale=with_index_k_scale,
        )

    def create_host_pool(
        self,
        device_pool: MLADevicePool,
        *,
        layout: HostLayout | str,
        host_to_device_ratio: float = 2.0,
        host_size_gb: float = 0.0,
        pin_memory: bool | None = None,
        io_backend: IOBackend | str | None = None,
    ) -> AscendMLAHostPool:
        """A ``page_first_kv_split`` host pool; other layouts raise ``UnsupportedLayoutError``."""
        return AscendMLAHostPool(
            device_pool,
            layout=layout,
            host_to_device_ratio=host_to_device_ratio,
            host_size_gb=host_size_gb,
            pin_memory=pin_memory,
            io_backend=io_backend,
        )


backend = AscendBackend()

if TYPE_CHECKING:
    from sgl_core import Backend, MLAHostPool

    _b: Backend = backend
    _d: MLADevicePool = AscendMLADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, kv_lora_rank=1, qk_rope_head_dim=1, layer_num=1
    )
    _h: MLAHostPool = AscendMLAHostPool(_d, layout="page_first_kv_split")
