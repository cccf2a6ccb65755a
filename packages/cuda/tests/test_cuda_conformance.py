"""The cuda backend against the shared conformance suite (CPU tensors under the interpreter)."""

from __future__ import annotations

import torch

from sgl_core.testing import BackendConformanceSuite


class TestCudaConformance(BackendConformanceSuite):
    backend_name = "cuda"
    # Concurrent transfers run here too: interpreted launches are serialized
    # (sgl_cuda._launch_lock), compiled GPU launches need no lock.


class TestCudaDSAConformance(BackendConformanceSuite):
    """DeepSeek-V3.2-style pools: 656-byte uint8 rows (82 kernel words) and an indexer
    cache (fp8-byte keys, fp32 scales moved by the direct engine) on two of three layers."""

    backend_name = "cuda"
    dtype = torch.uint8
    kv_cache_dim = 656
    index_head_dim = 16
    indexer_layer_ids = (0, 2)
    with_index_k_scale = True
    page_sizes = (1, 16)
