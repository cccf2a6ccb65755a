"""The cuda backend against the shared conformance suite (CPU tensors under the interpreter).

Every KV kind of ``sgl_core.testing.KINDS`` on every pair the backend declares:
DeepSeek-V3.2-style pools among them (656-byte uint8 rows, 82 kernel words,
and an indexer cache of fp8-byte keys and fp32 scales, moved by the direct
engine, on two of three layers).
"""

from __future__ import annotations

from sgl_core.testing import BackendConformanceSuite


class TestCudaConformance(BackendConformanceSuite):
    backend_name = "cuda"
    # Concurrent transfers run here too: interpreted launches are serialized
    # (sgl_cuda._kernels.interpreter_launch), compiled GPU launches need no lock.
