"""The shared backend conformance suite, run against the ascend backend on CPU tensors.

Every class runs every KV kind of ``sgl_core.testing.KINDS`` (MLA, packed
MLA, the indexer cache on split and on packed 656-byte rows, MHA with equal
and narrower V) on every pair the backend declares.
"""

from __future__ import annotations

import pytest
import torch

import sgl_ascend
from sgl_core import Backend
from sgl_core.backend import NEVER, CopyTuning
from sgl_core.errors import PoolMismatchError
from sgl_core.testing import BackendConformanceSuite


class TestAscendConformance(BackendConformanceSuite):
    backend_name = "ascend"


class TestAscendLoadByAddressConformance(TestAscendConformance):
    """The whole contract again, with every CPU per-row load copied by address."""

    @pytest.fixture
    def backend(self, monkeypatch: pytest.MonkeyPatch) -> Backend:
        # The backend's tuning object goes to every host pool it builds.
        monkeypatch.setattr(sgl_ascend.backend, "tuning", CopyTuning(by_address_min_block_bytes=0))
        return sgl_ascend.backend


class TestAscendGQAGatherConformance(TestAscendConformance):
    """More KV heads of narrower rows (GQA-like), every kv-split copy a gather."""

    head_num = 4
    head_dim = 8
    mha_v_head_dim = 4
    page_sizes = (1, 16)

    @pytest.fixture
    def backend(self, monkeypatch: pytest.MonkeyPatch) -> Backend:
        gather = CopyTuning(by_address_min_block_bytes=NEVER, gather_below_page_run_bytes=NEVER)
        monkeypatch.setattr(sgl_ascend.backend, "tuning", gather)
        return sgl_ascend.backend


def test_packed_pool_has_one_kv_component() -> None:
    """Packed 656-byte uint8 rows with the indexer: one k component, no v."""
    dev = sgl_ascend.backend.create_device_pool(
        size=32, page_size=16, dtype=torch.uint8, kv_lora_rank=512, qk_rope_head_dim=64,
        layer_num=3, kv_cache_dim=656, index_head_dim=16, indexer_layer_ids=[0, 2],
        with_index_k_scale=True,
    )  # fmt: skip
    assert isinstance(dev, sgl_ascend.AscendMLADevicePool)
    assert dev.v_buffer is None and dev.k_buffer.shape[-1] == 656
    host = sgl_ascend.backend.create_host_pool(dev, layout="page_first_kv_split")
    assert [b.shape[-1] for b in host.buffers] == [656, 16, 1]  # type: ignore[attr-defined]


def test_a_device_pool_that_lost_a_component_is_a_mismatch() -> None:
    dev = sgl_ascend.backend.create_device_pool(
        size=32, page_size=16, dtype=torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=8,
        layer_num=2,
    )  # fmt: skip
    host = sgl_ascend.backend.create_host_pool(dev, layout="page_first_kv_split")
    dev.v_buffer = None
    idx = torch.arange(16, 32)
    with pytest.raises(PoolMismatchError, match="components"):
        host.backup_from_device_all_layer(dev, idx, idx, "kernel_ascend")
