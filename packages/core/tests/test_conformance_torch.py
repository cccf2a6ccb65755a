"""The portable torch backend passes the conformance suite it is the oracle of.

Every KV kind of ``sgl_core.testing.KINDS`` (MLA, packed MLA, the DSA indexer
on split and on packed 656-byte rows, MHA with equal and narrower V) on every
(layout, io backend) pair the backend declares.
"""

from __future__ import annotations

from sgl_core.testing import BackendConformanceSuite


class TestTorchBackendConformance(BackendConformanceSuite):
    backend_name = "torch"
