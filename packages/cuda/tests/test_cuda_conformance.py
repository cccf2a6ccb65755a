"""The cuda backend against the shared conformance suite (CPU tensors under the interpreter)."""

from __future__ import annotations

from sgl_core.testing import BackendConformanceSuite


class TestCudaConformance(BackendConformanceSuite):
    backend_name = "cuda"
