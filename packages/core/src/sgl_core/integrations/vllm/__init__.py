"""Our host pools (and L3 stores) as vLLM 0.33's KV-offloading backend.

Load it in vLLM with ``"spec_name": "SglOffloadingSpec"`` and
``"spec_module_path": "sgl_core.integrations.vllm"`` in the
``OffloadingConnector``'s ``kv_connector_extra_config`` (docs/vllm.md); our
L3 stores as a secondary tier of vLLM's ``TieringOffloadingSpec`` with
``"type": "SglPageStoreTier"`` and ``"module_path": "sgl_core.integrations.vllm"``
in ``secondary_tiers``. Nothing here imports vLLM at import time.
"""

from sgl_core.backends._public import publish_names as _publish_names
from sgl_core.integrations.vllm._blocks import BlockDeviceView, BlockHost, BlockRows, kv_dtype
from sgl_core.integrations.vllm._chunk_rows import BlockStore, ChunkRows, chunk_format_fields
from sgl_core.integrations.vllm._spec import (
    SglOffloadingSpec,
    SglOffloadingWorker,
    register_with_vllm,
)
from sgl_core.integrations.vllm._tier import SglPageStoreTier

__all__ = [
    "BlockDeviceView",
    "BlockHost",
    "BlockRows",
    "BlockStore",
    "ChunkRows",
    "SglOffloadingSpec",
    "SglOffloadingWorker",
    "SglPageStoreTier",
    "chunk_format_fields",
    "kv_dtype",
    "register_with_vllm",
]

_publish_names(__name__, globals())  # sgl_core.integrations.vllm.SglOffloadingSpec, ...
del _publish_names
