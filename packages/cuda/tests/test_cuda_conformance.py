"""The cuda backend against the shared conformance suite (CPU tensors under the interpreter)."""

from __future__ import annotations

import torch

from sgl_core.testing import BackendConformanceSuite


class TestCudaConformance(BackendConformanceSuite):
    backend_name = "cuda"
    # Triton's CPU interpreter patches module state while a kernel runs, so two
    # threads cannot launch at once there; compiled GPU kernels can.
    concurrent_transfers = torch.cuda.is_available()
