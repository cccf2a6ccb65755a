"""sgl_core: device-agnostic protocols, pools and MoE combine for LLM serving.

Start with :func:`get_backend`, then build pools from it::

    import sgl_core
    backend = sgl_core.get_backend()
    dev = backend.create_device_pool(size=4096, page_size=64, dtype=torch.bfloat16,
                                     kv_lora_rank=512, qk_rope_head_dim=64, layer_num=61)
    host = backend.create_host_pool(dev, layout="page_first_direct")

MHA/GQA models: ``backend.create_mha_device_pool(size=..., page_size=..., dtype=...,
head_num=8, head_dim=128, layer_num=80)``; ``create_host_pool`` then returns an
``MHAHostPool`` (layouts in ``backend.supported_mha_pairs``).

This module is what an engine uses. What a device package builds on (pool
bases, the KV spec, the mover seam, the copy kit, entry-point groups) is
``sgl_core.backend``.
"""

# No ``from __future__ import annotations`` here: it would bind ``annotations``
# in the package namespace (``dir(sgl_core)``), and this module annotates nothing.
from sgl_core import errors
from sgl_core.backends._backend_base import TorchBackend
from sgl_core.backends._discovery import available_backends, clear_backend_cache, get_backend
from sgl_core.backends._public import publish_names as _publish_names
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.protocols._dsa_protocols import IndexerCache, KVRows
from sgl_core.kv.protocols._kv_protocols import (
    MHADevicePool,
    MHAHostPool,
    MLADevicePool,
    MLAHostPool,
)
from sgl_core.kv.protocols._protocols import Backend, MoEExperts, MoEMethod
from sgl_core.moe._moe import (
    MoEWeights,
    TorchMoEMethod,
    folds_routed_scale,
    maybe_fuse_routed_scale_and_shared_add,
    silu_and_mul,
)
from sgl_core.transfer.copy import (
    _auto_copy,  # noqa: F401  (registers the AUTO copies with sgl_core.transfer.copy._copy)
)

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "HostLayout",
    "IOBackend",
    "IndexerCache",
    "KVRows",
    "MHADevicePool",
    "MHAHostPool",
    "MLADevicePool",
    "MLAHostPool",
    "MoEExperts",
    "MoEMethod",
    "MoEWeights",
    "TorchBackend",
    "TorchMoEMethod",
    "__version__",
    "available_backends",
    "clear_backend_cache",
    "errors",
    "folds_routed_scale",
    "get_backend",
    "maybe_fuse_routed_scale_and_shared_add",
    "silu_and_mul",
]

# Every class and function above reports this public path in repr, pickles and
# runtime tools (``sgl_core.MoEMethod``, not ``sgl_core.kv.protocols._protocols.MoEMethod``).
_publish_names(__name__, globals())
del _publish_names
