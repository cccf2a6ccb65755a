"""vLLM 0.33's own CPU offloading worker beside ours, on the same blocks, bytes compared.

vLLM's ``CPUOffloadingSpec`` (from vLLM's factory) ``create_worker`` builds its
``CPUOffloadingWorker`` and handlers; the CUDA op, streams, events, pinned
memory and the device check of its KV tensors are the CPU stand-in of
``_cuda_standin`` (its docstring says exactly what and why). Ours is
``SglOffloadingSpec``'s worker on the torch backend. Both store the same GPU
blocks into the same CPU chunk ids and load them into the same other blocks:
vLLM's CPU chunk bytes equal our host pages byte for byte (``page_first``: a
page is one block of every layer, in layer order, as vLLM's chunk row of each
layer tensor), and both KV caches end equal, their destination blocks equal to
the source blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from _cuda_standin import as_device, cpu_as_cuda
from _vllm_support import LAYERS, kv_caches, kv_spec, offloading_config
from vllm.v1.kv_offload.base import CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from sgl_core.integrations.vllm import SglOffloadingWorker


@pytest.fixture(autouse=True)
def _standin() -> Iterator[None]:
    with cpu_as_cuda():
        yield


@pytest.mark.parametrize("kind", ["llama", "deepseek"])
def test_vllm_cpu_worker_and_ours_move_the_same_bytes(kind: str) -> None:
    src, chunks, dst = [3, 7, 2, 9], [1, 3, 0, 2], [10, 4, 11, 1]
    row = -(-LAYERS * kv_spec(kind).page_size_bytes // 4096) * 4096
    # vLLM's CPU spec rounds each chunk up to 4 KiB: room for the same 4 chunks
    # (it checks no chunk id: one past its end would be written past its buffer)
    theirs_spec = OffloadingSpecFactory.create_spec(
        offloading_config(kind, spec_name="CPUOffloadingSpec", extra={"cpu_bytes_to_use": 4 * row})
    )
    assert theirs_spec.num_chunks == 4
    assert type(theirs_spec) is CPUOffloadingSpec
    ours_spec = OffloadingSpecFactory.create_spec(offloading_config(kind))
    theirs_caches, ours_caches = kv_caches(kind), kv_caches(kind)
    device_view = CanonicalKVCaches(
        tensors=[
            CanonicalKVCacheTensor(as_device(t.tensor), t.page_size_bytes)
            for t in theirs_caches.canonical.tensors
        ],
        group_data_refs=theirs_caches.canonical.group_data_refs,
    )
    theirs = theirs_spec.create_worker(device_view)
    ours = ours_spec.get_worker(ours_caches.canonical)
    assert isinstance(theirs, CPUOffloadingWorker) and isinstance(ours, SglOffloadingWorker)
    before = ours_caches.block_bytes()

    for job, worker in enumerate((theirs, ours)):
        assert worker.submit_store(job, GPULoadStoreSpec(src, [4], [0]), CPULoadStoreSpec(chunks))
        worker.wait({job})
        (result,) = worker.get_finished()
        assert result.job_id == job and result.success
        assert (
            result.transfer_size == 4 * LAYERS * theirs_caches.canonical.tensors[0].page_size_bytes
        )

    # CPU side: vLLM's chunk c of layer l == our host page c's layer l
    cpu = [t.view(torch.uint8) for t in theirs._store_handler.dst_tensors]
    for c in range(len(chunks)):
        page = ours.host.pool.get_data_page(c).view(torch.uint8)
        assert torch.equal(page, torch.cat([t[c] for t in cpu])), c

    for job, worker in enumerate((theirs, ours), start=2):
        assert worker.submit_load(job, CPULoadStoreSpec(chunks), GPULoadStoreSpec(dst, [4], [0]))
        worker.wait({job})
        assert [r.job_id for r in worker.get_finished()] == [job]
    for old, mine, vllm_kv in zip(
        before, ours_caches.block_bytes(), theirs_caches.block_bytes(), strict=True
    ):
        assert torch.equal(mine, vllm_kv)
        assert torch.equal(mine[dst], old[src])
    theirs.shutdown()
