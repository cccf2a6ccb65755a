"""vLLM 0.33's tiering classes drive our FilePageStore as their secondary tier.

vLLM's ``OffloadingSpecFactory`` builds its ``TieringOffloadingSpec``; its
``get_manager`` builds the ``TieringOffloadingManager`` over its CPU primary
tier (the shared mmap region) and, through ``SecondaryTierFactory`` with
``module_path``, our ``SglPageStoreTier``. GPU <-> CPU moves are vLLM's own
``CPUOffloadingWorker`` (``create_worker``) run by vLLM's
``OffloadingConnectorWorker``, with the CUDA op, streams and events replaced
by the CPU stand-in of ``_cuda_standin`` (its docstring says exactly what).
Stores cascade to our tier on ``complete_store``; a second engine (another
``engine_id``, same store directory: a restart) finds the chunks through
``lookup`` (primary miss, our tier hit, promotion), loads them into its
blocks, and the bytes are compared with the first engine's blocks. A chunk of
another model, KV dtype or block layout is a miss; a corrupt record is a
failed promotion, which vLLM turns into a miss, with no byte of it written.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _cuda_standin import as_device, cpu_as_cuda
from _vllm_support import LAYERS, NUM_BLOCKS, kv_caches, kv_spec, offloading_config
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    TransferJob,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.base import TransferJob as TierJob
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from sgl_core.errors import ArgumentTypeError, IndexOutOfRangeError, PoolMismatchError
from sgl_core.integrations.vllm import SglPageStoreTier

KINDS = ["llama", "deepseek"]
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


@pytest.fixture(autouse=True)
def _standin() -> Iterator[None]:
    with cpu_as_cuda():
        yield


def _keys(n: int, salt: int = 0) -> list[bytes]:
    return [make_offload_key(bytes([salt, i]) * 16, 0) for i in range(n)]


def _config(kind: str, root: Path, *, per: int = 1, **kw: Any) -> Any:
    tier = {
        "type": "SglPageStoreTier",
        "module_path": "sgl_core.integrations.vllm",
        "store": "file",
        "root_dir": str(root),
    }
    row = -(-per * LAYERS * kv_spec(kind).page_size_bytes // 4096) * 4096
    layout = kw.pop("kv_cache_layout", None)
    config = offloading_config(
        kind,
        spec_name="TieringOffloadingSpec",
        blocks_per_chunk=per,
        extra={"secondary_tiers": [tier], "cpu_bytes_to_use": 4 * row},
        **kw,
    )
    return dataclasses.replace(
        config, engine_id=f"sgltest-{uuid.uuid4().hex[:12]}", kv_cache_layout=layout
    )


class Engine:
    """One vLLM engine's offloading: the tiering manager (scheduler side) and
    vLLM's connector worker over vLLM's CPU worker (worker side)."""

    def __init__(self, config: Any, kind: str, seed: int) -> None:
        self.spec = OffloadingSpecFactory.create_spec(config)
        assert type(self.spec) is TieringOffloadingSpec
        self.manager = self.spec.get_manager()
        assert isinstance(self.manager, TieringOffloadingManager)
        (self.tier,) = self.manager.secondary_tiers
        self.caches = kv_caches(kind, seed=seed)
        canonical = CanonicalKVCaches(
            tensors=[
                CanonicalKVCacheTensor(as_device(t.tensor), t.page_size_bytes)
                for t in self.caches.canonical.tensors
            ],
            group_data_refs=self.caches.canonical.group_data_refs,
        )
        # get_worker minus its platform check (see _cuda_standin)
        self.spec._worker = self.spec.create_worker(canonical)
        assert isinstance(self.spec._worker, CPUOffloadingWorker)
        self.worker = OffloadingConnectorWorker(self.spec, None, None)  # type: ignore[arg-type]
        self.worker._init_worker(canonical)
        self.n = 0

    def step(self) -> None:
        with self.manager.lock:
            self.manager.on_schedule_end(STEP)

    def store(self, keys: list[bytes], blocks: list[int]) -> None:
        ctx = self._ctx()
        with self.manager.lock:
            out = self.manager.prepare_store(keys, ctx)
        assert out is not None and list(out.keys_to_store) == keys
        job = TransferJob(ctx.req_id, GPULoadStoreSpec(blocks, [len(blocks)], [0]), out.store_spec)
        self._run(stores={self._job(): job})
        with self.manager.lock:
            self.manager.complete_store(keys, ctx)  # cascades to our tier
        self.tier.drain_jobs()
        self.step()

    def lookup(self, keys: list[bytes], ctx: ReqContext) -> list[LookupResult]:
        with self.manager.lock:
            return [self.manager.lookup(k, ctx) for k in keys]

    def promote(self, keys: list[bytes]) -> tuple[ReqContext, list[LookupResult]]:
        """Look keys up as the scheduler does until they settle (promotions run)."""
        ctx = self._ctx()
        first = self.lookup(keys, ctx)
        self.step()  # flushes the promotions: our submit_load
        self.tier.drain_jobs()
        self.step()  # their results
        return ctx, first

    def load(self, keys: list[bytes], ctx: ReqContext, blocks: list[int]) -> set[str]:
        with self.manager.lock:
            spec = self.manager.prepare_load(keys, ctx)
        job = TransferJob(ctx.req_id, spec, GPULoadStoreSpec(blocks, [len(blocks)], [0]))
        done = self._run(loads={self._job(): job})
        with self.manager.lock:
            self.manager.complete_load(keys, ctx)
        return done

    def rows(self) -> np.ndarray:
        return np.asarray(self.manager.primary_tier.get_kv_memoryview()).copy()

    def close(self) -> None:
        self.worker.shutdown()
        self.manager.shutdown()

    def _ctx(self) -> ReqContext:
        self.n += 1
        ctx = ReqContext(req_id=f"r{self.n}")
        with self.manager.lock:
            self.manager.on_new_request(ctx)
        return ctx

    def _job(self) -> int:
        self.n += 1
        return self.n

    def _run(self, loads: Any = None, stores: Any = None) -> set[str]:
        meta = OffloadingConnectorMetadata(load_jobs=loads or {}, store_jobs=stores or {})
        if stores:
            self.worker.prepare_store_kv(meta)
            meta = OffloadingConnectorMetadata(load_jobs=loads or {}, store_jobs={})
        self.worker.start_kv_transfers(meta)
        _, recving = self.worker.get_finished(set())
        return recving


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.close()


def _engine(engines: list[Engine], config: Any, kind: str, seed: int) -> Engine:
    engines.append(Engine(config, kind, seed))
    return engines[-1]


@pytest.mark.parametrize("per", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_chunks_cascade_to_our_store_and_come_back_after_a_restart(
    tmp_path: Path, engines: list[Engine], kind: str, per: int
) -> None:
    first = _engine(engines, _config(kind, tmp_path, per=per), kind, seed=0)
    assert isinstance(first.tier, SglPageStoreTier) and isinstance(first.tier, SecondaryTierManager)
    src = [3, 7, 2, 9]
    keys = _keys(len(src) // per)
    first.store(keys, src)
    assert first.tier.store.stats().pages_set == len(keys)

    second = _engine(engines, _config(kind, tmp_path, per=per), kind, seed=1)
    before = second.caches.block_bytes()
    ctx, seen = second.promote(keys)
    assert seen == [LookupResult.HIT_PENDING] * len(keys)  # primary miss, our tier's hit
    assert second.lookup(keys, ctx) == [LookupResult.HIT] * len(keys)
    dst = [10, 4, 11, 1]
    assert second.load(keys, ctx, dst) == {ctx.req_id}
    after, ref = second.caches.block_bytes(), first.caches.block_bytes()
    untouched = [b for b in range(NUM_BLOCKS) if b not in dst]
    for layer in range(LAYERS):
        assert torch.equal(after[layer][dst], ref[layer][src]), layer
        assert torch.equal(after[layer][untouched], before[layer][untouched]), layer


MISSES = {
    "another model": {"model": "test/other-model"},
    "another KV dtype": {"dtype": "float16"},
    "another block layout (kv_cache_layout)": {"kv_cache_layout": "HND"},
    "another chunking": {"per": 2},
}


@pytest.mark.parametrize("case", sorted(MISSES))
@pytest.mark.parametrize("kind", KINDS)
def test_chunk_of_another_model_dtype_or_layout_is_a_miss(
    tmp_path: Path, engines: list[Engine], kind: str, case: str
) -> None:
    first = _engine(engines, _config(kind, tmp_path), kind, seed=0)
    keys = _keys(2)
    first.store(keys, [3, 7])
    same = _engine(engines, _config(kind, tmp_path), kind, seed=1)
    assert same.promote(keys[:1])[1] == [LookupResult.HIT_PENDING]  # the control: a hit
    other = _engine(engines, _config(kind, tmp_path, **MISSES[case]), kind, seed=2)
    rows = other.rows()
    ctx, seen = other.promote(keys)
    assert seen == [LookupResult.MISS] * 2
    assert other.lookup(keys, ctx) == [LookupResult.MISS] * 2
    assert np.array_equal(other.rows(), rows)
    assert other.tier.store.stats().pages_get == 0


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_record_is_a_failed_promotion_then_a_miss(
    tmp_path: Path, engines: list[Engine], kind: str
) -> None:
    first = _engine(engines, _config(kind, tmp_path), kind, seed=0)
    keys = _keys(2)
    first.store(keys, [3, 7])
    path = first.tier.store._path(SglPageStoreTier.store_key(keys[1]))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # one payload bit: same length, the CRC no longer matches
    path.write_bytes(bytes(data))

    second = _engine(engines, _config(kind, tmp_path), kind, seed=1)
    rows = second.rows()
    ctx, seen = second.promote(keys)
    assert seen == [LookupResult.HIT_PENDING] * 2  # the file is whole by size
    # the good chunk came in, the corrupt one is gone from the primary tier
    assert second.lookup(keys, ctx) == [LookupResult.HIT, LookupResult.MISS]
    stats = second.tier.store.stats()
    assert stats.pages_get == 1 and stats.errors.get("corrupt") == 1
    new = second.rows()
    changed = [c for c in range(len(rows)) if not np.array_equal(new[c], rows[c])]
    assert len(changed) == 1  # only the verified chunk's row was written
    assert not path.exists()  # a bad record is dropped, the chunk can be stored again


def test_bad_jobs_raise_typed_errors_before_anything_runs(
    tmp_path: Path, engines: list[Engine]
) -> None:
    engine = _engine(engines, _config("llama", tmp_path), "llama", seed=0)
    tier = engine.tier
    ctx = ReqContext(req_id="x")
    bad = [
        (TierJob(1, _keys(1), np.array([99]), True, ctx), IndexOutOfRangeError),
        (TierJob(2, _keys(1), np.array([0, 1]), True, ctx), IndexOutOfRangeError),
        (TierJob(3, ["str-key"], np.array([0]), False, ctx), ArgumentTypeError),
        (TierJob(4, _keys(1), np.array([0.5]), False, ctx), ArgumentTypeError),
    ]
    rows = engine.rows()
    for job, error in bad:
        with pytest.raises(error):
            (tier.submit_load if job.is_promotion else tier.submit_store)(job)
        assert not tier.has_pending_work()
    assert np.array_equal(engine.rows(), rows)
    assert tier.store.stats().pages_set == tier.store.stats().pages_get == 0
    # one job id in flight once
    job = TierJob(5, _keys(1), np.array([0]), False, ctx)
    tier.submit_store(job)
    with pytest.raises(ArgumentTypeError, match="in flight"):
        tier.submit_store(job)
    tier.drain_jobs()
    assert [r.job_id for r in tier.get_finished_jobs()] == [5]
    # rows that are not the spec's chunks are refused at construction
    with pytest.raises(PoolMismatchError):
        SglPageStoreTier(
            engine.spec,
            memoryview(np.zeros((4, 2 * tier.block_size_bytes), dtype=np.int8)),
            "SglPageStoreTier",
            root_dir=str(tmp_path),
        )
