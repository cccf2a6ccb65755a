"""The cuda backend against the shared conformance suite (CPU tensors under the interpreter)."""

from __future__ import annotations

from sgl_core.testing import BackendConformanceSuite


class TestCudaConformance(BackendConformanceSuite):
    backend_name = "cuda"
    # Concurrent transfers run here too: interpreted launches are serialized
    # (sgl_cuda._launch_lock), compiled GPU launches need no lock.
