"""Our host pools (and L3 stores) as vLLM 0.33's KV-offloading backend and secondary tier.

How vLLM loads each: docs/vllm.md ("Enabling it in a vLLM server", "L3 stores as
vLLM's secondary tier"). Nothing here imports vLLM at import time.
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
