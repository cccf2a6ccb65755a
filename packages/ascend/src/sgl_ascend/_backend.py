"""The ``ascend`` backend object registered under entry-point group ``sgl.backends``.

When ``get_backend`` picks it, and CPU pools without an NPU: the package docstring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sgl_ascend import _npu
from sgl_ascend._device_kinds import AscendMHADevicePool, AscendMLADevicePool, engine_view
from sgl_ascend._host_pool import AscendMHAHostPool, AscendMLAHostPool
from sgl_core.backend import CopyTuning, IOBackend, MLADevicePool, PoolBackend

__all__ = ["AscendBackend", "backend"]


class AscendBackend(PoolBackend[AscendMLADevicePool, AscendMLAHostPool]):
    """Backend ``"ascend"``: contiguous multi-layer pools and ``kernel_ascend`` transfers.

    MLA (and DSA) device pools come from ``create_device_pool`` (the
    ``PoolBackend`` one: an :class:`AscendMLADevicePool`), MHA / GQA ones from
    ``create_mha_device_pool``; ``create_host_pool`` builds the host pool of
    the device pool's kind (both ``page_first_kv_split`` / ``kernel_ascend``).
    A device pool's ``device`` None is the NPU when usable, else CPU; ``"npu"``
    without ``torch_npu`` raises ``BackendUnavailableError``, before allocating.
    """

    name = "ascend"
    #: Its one layout runs only ``kernel_ascend``.
    io_preference = (IOBackend.KERNEL_ASCEND,)

    def __init__(self, *, tuning: CopyTuning | None = None) -> None:
        super().__init__(
            AscendMLADevicePool,
            AscendMLAHostPool,
            tuning=tuning,
            mha_device_pool_class=AscendMHADevicePool,
            mha_host_pool_class=AscendMHAHostPool,
        )

    def create_host_pool(self, device_pool: Any, **kwargs: Any) -> Any:
        """As ``PoolBackend.create_host_pool`` (a layout this backend does not build
        raises ``UnsupportedLayoutError``; ``io_backend`` becomes the pool's
        ``default_io_backend``); SGLang's ``NPUMLATokenToKVPool`` /
        ``NPUMHATokenToKVPool`` are taken as views of their own tensors."""
        return super().create_host_pool(engine_view(device_pool), **kwargs)

    def is_available(self) -> bool:
        """True only when ``torch_npu`` imports and an NPU is visible."""
        return _npu.npu_available()


backend = AscendBackend()

if TYPE_CHECKING:
    from sgl_core import Backend, MHADevicePool, MHAHostPool, MLAHostPool

    _b: Backend = backend
    _d: MLADevicePool = AscendMLADevicePool(
        size=1, page_size=1, dtype=torch.bfloat16, kv_lora_rank=1, qk_rope_head_dim=1, layer_num=1
    )
    _h: MLAHostPool = AscendMLAHostPool(_d, layout="page_first_kv_split")
    _md: MHADevicePool = backend.create_mha_device_pool(
        size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
    )
    _mh: MHAHostPool = backend.create_host_pool(_md, layout="page_first_kv_split")
