"""The portable torch backend passes the conformance suite it is the oracle of."""

from __future__ import annotations

import torch

from sgl_core.testing import BackendConformanceSuite


class TestTorchBackendConformance(BackendConformanceSuite):
    backend_name = "torch"


class TestTorchDSAConformance(BackendConformanceSuite):
    """The whole contract on DeepSeek-V3.2-style pools: 656-byte uint8 rows, an indexer
    cache (fp8-byte keys and fp32 scales) on two of three layers."""

    backend_name = "torch"
    dtype = torch.uint8
    kv_cache_dim = 656
    index_head_dim = 16
    indexer_layer_ids = (0, 2)
    with_index_k_scale = True
    page_sizes = (1, 16)
