"""The portable torch backend passes the conformance suite it is the oracle of."""

from __future__ import annotations

from sgl_core.testing import BackendConformanceSuite


class TestTorchBackendConformance(BackendConformanceSuite):
    backend_name = "torch"
