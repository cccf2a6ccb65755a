"""vLLM 0.33's own CPU offloading worker beside ours, on the same blocks, interleaved.

Run in the core env (``hatch run core:python scripts/vllm_worker_ab.py``; the
vLLM pins of ``tests/with_vllm/requirements-nodeps.txt`` must be installed,
which ``hatch run core:vllm`` does).

* vLLM's: ``CPUOffloadingSpec`` from vLLM's ``OffloadingSpecFactory``,
  ``create_worker`` -> its ``CPUOffloadingWorker`` and two
  ``SingleDirectionOffloadingHandler``s (all vLLM's Python: descriptor
  building, stream/event bookkeeping, results). The CUDA pieces it needs are
  replaced by the CPU stand-in of ``tests/with_vllm/_cuda_standin.py`` (the
  compiled ``swap_blocks_batch`` op as one call into a C ``memcpy`` loop,
  streams/events as no-ops over ``perf_counter``, no pinned memory, CPU
  tensors that say ``is_cuda``); ``get_worker``'s platform check is skipped
  by calling ``create_worker``. On CPU its host buffer is its private-tensor
  path (a shared mmap only on CUDA/XPU), the handler code is the same.
* Ours: ``SglOffloadingSpec`` from the same factory, ``get_worker`` ->
  ``SglOffloadingWorker`` over the torch backend's host pool.

Each case: one store job (GPU blocks -> CPU chunks) and one load job (chunks ->
other GPU blocks) per worker and round, each worker on its own copy of the
same KV caches. Before timing, every destination block of both workers is
compared byte for byte with the source blocks (exit 1 on a mismatch). Rounds
alternate which worker goes first. Times are ``perf_counter`` around submit +
``get_finished`` (the job is done on return on CPU); the stand-in op's own time
is counted apart, so ``vLLM py`` = vLLM's Python around the op. ``ratio`` =
ours / vLLM's (< 1: ours is faster), for our host pool in ``page_first`` (the
default) and ``layer_first``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "with_vllm"))

import _cuda_standin
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    MLAAttentionSpec,
    compute_layer_kv_cache_shape_bytes,
)
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

BLOCK = 16
SIDES = ("vLLM", "SglOffloadingSpec page_first", "SglOffloadingSpec layer_first")

CASES = {
    # name: (attention spec, layers, GPU blocks, blocks per job)
    "llama-8b GQA 8x128 bf16, 32 layers, 64 blocks": (
        FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16),
        32,
        160,
        64,
    ),
    "llama-8b GQA, 32 layers, 4 blocks": (
        FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16),
        32,
        160,
        4,
    ),
    "deepseek MLA 576 bf16, 61 layers, 64 blocks": (
        MLAAttentionSpec(
            block_size=BLOCK,
            num_kv_heads=1,
            head_size=576,
            dtype=torch.bfloat16,
            cache_dtype_str="auto",
        ),
        61,
        160,
        64,
    ),
}


def _config(spec: Any, layers: int, chunks: int, name: str) -> OffloadingConfig:
    per_block = layers * spec.page_size_bytes
    extra: dict[str, Any] = {"spec_name": name, "cpu_bytes_to_use": chunks * per_block}
    if name.startswith("SglOffloadingSpec"):
        extra.update(spec_module_path="sgl_core.integrations.vllm", sgl_backend="torch")
    else:  # vLLM's CPU spec rounds each chunk up to 4 KiB
        extra["cpu_bytes_to_use"] = chunks * (-(-per_block // 4096) * 4096)
    return OffloadingConfig(
        groups=(
            OffloadingGroupConfig(
                tokens_per_block=BLOCK,
                layer_names=tuple(f"model.layers.{i}.attn" for i in range(layers)),
                group_id=0,
            ),
        ),
        worker_kv_bytes_per_block=per_block,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id="bench",
        model=OffloadingModelConfig(name="bench", dtype="bfloat16", max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=BLOCK, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def _caches(spec: Any, layers: int, blocks: int, device: bool) -> tuple[list[torch.Tensor], Any]:
    shape = compute_layer_kv_cache_shape_bytes(spec, blocks)
    g = torch.Generator().manual_seed(0)
    kv = [torch.randint(-128, 128, shape, dtype=torch.int8, generator=g) for _ in range(layers)]
    page = spec.page_size_bytes
    tensors, refs = [], []
    for i, layer in enumerate(kv):
        view = layer.view(blocks, page)
        tensors.append(
            CanonicalKVCacheTensor(
                tensor=_cuda_standin.as_device(view) if device else view, page_size_bytes=page
            )
        )
        refs.append(CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page))
    flat = [t.view(blocks, page) for t in kv]
    return flat, CanonicalKVCaches(tensors=tensors, group_data_refs=[refs])


class Side:
    def __init__(self, name: str, spec: Any, layers: int, blocks: int, per_job: int) -> None:
        self.name = name
        theirs = name == "vLLM"
        config = _config(
            spec, layers, per_job, "CPUOffloadingSpec" if theirs else "SglOffloadingSpec"
        )
        if not theirs:
            config.extra_config["sgl_host_layout"] = name.rsplit(maxsplit=1)[-1]
        self.spec = OffloadingSpecFactory.create_spec(config)
        self.kv, canonical = _caches(spec, layers, blocks, device=theirs)
        self.worker = (
            self.spec.create_worker(canonical) if theirs else self.spec.get_worker(canonical)
        )
        self.job = 0

    def _finish(self) -> None:
        results = self.worker.get_finished()
        assert len(results) == 1 and results[0].success, results

    def store(self, src: list[int], chunks: list[int]) -> float:
        self.job += 1
        gpu, cpu = GPULoadStoreSpec(src, [len(src)], [0]), CPULoadStoreSpec(chunks)
        start = time.perf_counter()
        assert self.worker.submit_store(self.job, gpu, cpu)
        self._finish()
        return time.perf_counter() - start

    def load(self, chunks: list[int], dst: list[int]) -> float:
        self.job += 1
        gpu, cpu = GPULoadStoreSpec(dst, [len(dst)], [0]), CPULoadStoreSpec(chunks)
        start = time.perf_counter()
        assert self.worker.submit_load(self.job, cpu, gpu)
        self._finish()
        return time.perf_counter() - start


def _run_case(name: str, rounds: int) -> list[str]:
    spec, layers, blocks, per_job = CASES[name]
    g = torch.Generator().manual_seed(1)
    order = torch.randperm(blocks - 1, generator=g) + 1
    src, dst = order[:per_job].tolist(), order[per_job : 2 * per_job].tolist()
    chunks = torch.randperm(per_job, generator=g).tolist()
    sides = [Side(n, spec, layers, blocks, per_job) for n in SIDES]
    # bytes first: a round trip on each side, destination blocks == source blocks
    for side in sides:
        side.store(src, chunks)
        side.load(chunks, dst)
        for layer, t in enumerate(side.kv):
            if not torch.equal(t[dst], t[src]):
                sys.exit(f"{name}: {side.name} layer {layer}: loaded blocks differ from the source")
    for other in sides[1:]:
        if not all(torch.equal(a, b) for a, b in zip(sides[0].kv, other.kv, strict=True)):
            sys.exit(f"{name}: vLLM's and {other.name}'s KV caches differ after the round trip")
    times: dict[tuple[str, str], list[float]] = {}
    op: dict[str, list[float]] = {"store": [], "load": []}
    for r in range(rounds + 1):  # round 0 warms up
        for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
            for direction in ("store", "load"):
                before = _cuda_standin.OP_SECONDS[0]
                t = side.store(src, chunks) if direction == "store" else side.load(chunks, dst)
                if r:
                    times.setdefault((side.name, direction), []).append(t)
                    if side.name == "vLLM":
                        op[direction].append(_cuda_standin.OP_SECONDS[0] - before)
    nbytes = per_job * layers * spec.page_size_bytes
    lines = []
    for direction in ("store", "load"):
        theirs = statistics.median(times[("vLLM", direction)])
        op_ms = statistics.median(op[direction]) * 1e3
        ours = [statistics.median(times[(n, direction)]) for n in SIDES[1:]]
        cells = " | ".join(f"{t * 1e3:.2f} | {t / theirs:.2f}" for t in ours)
        lines.append(
            f"| {name} | {direction} | {nbytes / 2**20:.1f} | {theirs * 1e3:.2f} | {op_ms:.2f} | "
            f"{theirs * 1e3 - op_ms:.2f} | {cells} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--op", choices=("c", "loop"), default="c", help="the stand-in copy op (see docstring)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    op = _cuda_standin.c_swap_blocks_batch() if args.op == "c" else None
    if args.op == "c" and op is None:
        sys.exit("no C compiler: run with --op loop")
    load = os.getloadavg()
    print(
        f"# torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at start"
    )
    print(f"# stand-in op: {'C memcpy loop, one call' if op else 'one ctypes.memmove per block'}")
    print(
        "| case | job | MiB | vLLM ms | of which op ms | vLLM py ms | ours page_first ms "
        "| ratio | ours layer_first ms | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with _cuda_standin.cpu_as_cuda(op):
        for name in CASES:
            for line in _run_case(name, args.rounds):
                print(line, flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} at the end; medians of {args.rounds} rounds")


if __name__ == "__main__":
    main()
