"""vLLM 0.33's offloading connector classes store and load blocks through our spec.

Per model kind (Llama-like GQA, DeepSeek-like MLA) and chunk size: vLLM's
``OffloadingSpecFactory`` loads ``SglOffloadingSpec`` from ``spec_module_path``;
vLLM's ``CPUOffloadingManager`` (our spec's manager) plans the store and the
load (``prepare_store``, ``complete_store``, ``lookup``, ``prepare_load``,
``complete_load``); vLLM's ``OffloadingConnectorWorker`` runs the jobs
(``prepare_store_kv``, ``start_kv_transfers``, ``get_finished``,
``build_connector_worker_meta``) on our worker. Bytes are compared with the
KV caches' own blocks.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from _vllm_support import NUM_BLOCKS, kv_caches, offloading_config
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    TransferJob,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LookupResult,
    OffloadingSpec,
    OffloadingWorker,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from sgl_core.errors import IndexOutOfRangeError, IndexShapeError, UnsupportedLayoutError
from sgl_core.integrations.vllm import SglOffloadingSpec, SglOffloadingWorker

KINDS = ["llama", "deepseek"]


def _keys(n: int, salt: int = 0) -> list[bytes]:
    return [make_offload_key(bytes([salt, i]) * 16, 0) for i in range(n)]


def _connector_worker(spec: OffloadingSpec, caches) -> OffloadingConnectorWorker:
    # vLLM's worker side; _init_worker is what register_kv_caches ends with
    worker = OffloadingConnectorWorker(spec, None, None)  # type: ignore[arg-type]
    worker._init_worker(caches.canonical)
    return worker


def _run(worker: OffloadingConnectorWorker, loads=None, stores=None) -> set[str]:
    meta = OffloadingConnectorMetadata(load_jobs=loads or {}, store_jobs=stores or {})
    if stores:
        worker.prepare_store_kv(meta)  # wait_for_save: deferred to the next step
        meta = OffloadingConnectorMetadata(load_jobs=loads or {}, store_jobs={})
    worker.start_kv_transfers(meta)
    _, recving = worker.get_finished(set())
    return recving


@pytest.mark.parametrize("per", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_connector_stores_and_loads_blocks_through_our_spec(kind: str, per: int) -> None:
    config = offloading_config(kind, blocks_per_chunk=per)
    spec = OffloadingSpecFactory.create_spec(config)
    assert type(spec) is SglOffloadingSpec and isinstance(spec, OffloadingSpec)
    manager = spec.get_manager()
    assert isinstance(manager, CPUOffloadingManager)
    caches = kv_caches(kind)
    worker = _connector_worker(spec, caches)
    assert isinstance(worker.worker, SglOffloadingWorker)
    assert isinstance(worker.worker, OffloadingWorker)
    before = caches.block_bytes()

    # store: 4 GPU blocks of one request = 4 / per chunks
    src_blocks = [3, 7, 2, 9]
    chunk_keys = _keys(4 // per)
    ctx = ReqContext(req_id="r1")
    with manager.lock:
        manager.on_new_request(ctx)
        out = manager.prepare_store(chunk_keys, ctx)
    assert out is not None and isinstance(out.store_spec, CPULoadStoreSpec)
    store = TransferJob("r1", GPULoadStoreSpec(src_blocks, [4], [0]), out.store_spec)
    assert _run(worker, stores={1: store}) == set()
    assert worker.build_connector_worker_meta().completed_jobs == {1: 1}
    with manager.lock:
        manager.complete_store(chunk_keys, ctx)
        assert [manager.lookup(k, ctx) for k in chunk_keys] == [LookupResult.HIT] * len(chunk_keys)
        assert manager.lookup(_keys(1, salt=9)[0], ctx) == LookupResult.MISS
    assert all(torch.equal(a, b) for a, b in zip(before, caches.block_bytes(), strict=True))

    # load into other blocks of a second request
    dst_blocks = [10, 4, 11, 1]
    ctx2 = ReqContext(req_id="r2")
    with manager.lock:
        manager.on_new_request(ctx2)
        load_spec = manager.prepare_load(chunk_keys, ctx2)
    load = TransferJob("r2", load_spec, GPULoadStoreSpec(dst_blocks, [4], [0]))
    assert _run(worker, loads={2: load}) == {"r2"}
    with manager.lock:
        manager.complete_load(chunk_keys, ctx2)
    after = caches.block_bytes()
    untouched = [b for b in range(NUM_BLOCKS) if b not in dst_blocks]
    for layer, (old, new) in enumerate(zip(before, after, strict=True)):
        assert torch.equal(new[dst_blocks], old[src_blocks]), layer
        assert torch.equal(new[untouched], old[untouched]), layer
    worker.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_partial_first_chunk_loads_the_right_sub_blocks(kind: str) -> None:
    # blocks 2..4 of a request with 2 blocks per chunk: the first chunk's
    # sub-block 0 (logical block 1) is skipped, as vLLM's CPU worker skips it
    spec = OffloadingSpecFactory.create_spec(offloading_config(kind, blocks_per_chunk=2))
    caches = kv_caches(kind, seed=1)
    worker = _connector_worker(spec, caches)
    before = caches.block_bytes()
    chunks = CPULoadStoreSpec([2, 0])
    _run(worker, stores={1: TransferJob("r", GPULoadStoreSpec([5, 6, 8], [3], [1]), chunks)})
    _run(
        worker,
        loads={
            2: TransferJob("r", CPULoadStoreSpec([2, 0]), GPULoadStoreSpec([9, 10, 11], [3], [1]))
        },
    )
    after = caches.block_bytes()
    for old, new in zip(before, after, strict=True):
        assert torch.equal(new[[9, 10, 11]], old[[5, 6, 8]])


@pytest.mark.parametrize("kind", KINDS)
def test_bad_job_raises_typed_error_and_changes_nothing(kind: str) -> None:
    spec = OffloadingSpecFactory.create_spec(offloading_config(kind))
    caches = kv_caches(kind, seed=2)
    worker = _connector_worker(spec, caches)
    _run(
        worker,
        stores={1: TransferJob("r", GPULoadStoreSpec([1, 2], [2], [0]), CPULoadStoreSpec([0, 1]))},
    )
    host = worker.worker.host.pool
    before = caches.block_bytes() + [
        host.get_data_page(p).view(torch.uint8) for p in range(host.size)
    ]
    bad = [
        (
            CPULoadStoreSpec([0, 1]),
            GPULoadStoreSpec([5, NUM_BLOCKS], [2], [0]),
            IndexOutOfRangeError,
        ),
        (CPULoadStoreSpec([0, 99]), GPULoadStoreSpec([5, 6], [2], [0]), IndexOutOfRangeError),
        (CPULoadStoreSpec([0]), GPULoadStoreSpec([5, 6], [2], [0]), IndexShapeError),
        (
            CPULoadStoreSpec([0, 1]),
            GPULoadStoreSpec([5, 6], [1, 1], [0, 0]),
            UnsupportedLayoutError,
        ),
    ]
    for src, dst, error in bad:
        # a fresh connector worker per call (the spec keeps one SglOffloadingWorker):
        # vLLM keeps a store that raised queued, and a raise ends its engine anyway
        with pytest.raises(error):
            _run(_connector_worker(spec, caches), loads={7: TransferJob("r", src, dst)})
        with pytest.raises(error):
            _run(_connector_worker(spec, caches), stores={8: TransferJob("r", dst, src)})
    after = caches.block_bytes() + [
        host.get_data_page(p).view(torch.uint8) for p in range(host.size)
    ]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_vllm_cpu_spec_beside_ours_same_manager_plan_and_no_cpu_worker(kind: str) -> None:
    """vLLM's own CPUOffloadingSpec on the same blocks: its manager plans the
    same chunks as ours; its worker cannot be built on CPU (it refuses a non-CUDA
    platform, allocates pinned host memory, asserts CUDA/XPU KV tensors and copies
    with the compiled ``swap_blocks_batch`` op on CUDA streams), which is why the
    bytes are checked against the KV caches' own blocks."""
    ours = OffloadingSpecFactory.create_spec(offloading_config(kind))
    theirs = OffloadingSpecFactory.create_spec(
        offloading_config(kind, spec_name="CPUOffloadingSpec")
    )
    assert type(theirs) is CPUOffloadingSpec
    keys = _keys(3)
    plans = []
    for spec in (ours, theirs):
        manager = spec.get_manager()
        ctx = ReqContext(req_id="r")
        with manager.lock:
            manager.on_new_request(ctx)
            out = manager.prepare_store(keys, ctx)
        plans.append(out.store_spec.block_ids.tolist())
    assert plans[0] == plans[1]
    with pytest.raises(Exception, match="CUDA"):
        theirs.get_worker(kv_caches(kind).canonical)
    # below the platform check: its host tensor is allocated pinned, which CPU
    # torch cannot (and past that it asserts CUDA/XPU KV tensors)
    with pytest.raises(RuntimeError, match="pin_memory"):
        theirs.create_worker(kv_caches(kind).canonical)


def test_unsupported_configs_are_refused_before_allocation() -> None:
    canonical = dataclasses.replace(offloading_config("llama"), canonical_layout=True)
    with pytest.raises(UnsupportedLayoutError):
        OffloadingSpecFactory.create_spec(canonical)
    caches = kv_caches("llama")
    spec = OffloadingSpecFactory.create_spec(offloading_config("llama"))
    refs = caches.canonical.group_data_refs
    with pytest.raises(UnsupportedLayoutError):  # a hybrid model's second group
        spec.get_worker(CanonicalKVCaches(caches.canonical.tensors, refs * 2))
    with pytest.raises(UnsupportedLayoutError):  # the KV dtype is part of the rows
        OffloadingSpecFactory.create_spec(offloading_config("llama", dtype="int4")).get_worker(
            caches.canonical
        )


def test_importing_our_module_loads_no_vllm() -> None:
    code = (
        "import sys, sgl_core.integrations.vllm as m; "
        "bad = [n for n in sys.modules if n == 'vllm' or n.startswith('vllm.')]; "
        "assert not bad, bad; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
