"""``SglOffloadingSpec``: vLLM's ``OffloadingSpec`` over our host pools and movers.

Imports nothing from vLLM at import time (an import-linter contract): the spec
and worker become *virtual* subclasses of vLLM's ``OffloadingSpec`` /
``OffloadingWorker`` once vLLM's base module is loaded. The scheduler side is
vLLM's own ``CPUOffloadingManager`` (docs/vllm.md).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from sgl_core.errors import ArgumentTypeError, PoolMismatchError, UnsupportedLayoutError
from sgl_core.integrations.vllm._blocks import BlockDeviceView, BlockHost, BlockRows, kv_dtype
from sgl_core.integrations.vllm._chunk_rows import positive_int
from sgl_core.integrations.vllm._tier import _BASE, _TIER_BASE, SglPageStoreTier, _vllm

__all__ = ["SglOffloadingSpec", "SglOffloadingWorker", "register_with_vllm"]


def register_with_vllm() -> None:
    """Make our classes virtual subclasses of vLLM's (imports vLLM): the spec,
    its worker and the secondary tier (``SglPageStoreTier``)."""
    base = _vllm(_BASE)
    base.OffloadingSpec.register(SglOffloadingSpec)
    base.OffloadingWorker.register(SglOffloadingWorker)
    _vllm(_TIER_BASE).SecondaryTierManager.register(SglPageStoreTier)


@dataclass(frozen=True)
class _Job:
    job_id: int
    num_bytes: int
    seconds: float


class SglOffloadingWorker:
    """vLLM's ``OffloadingWorker`` contract on a :class:`BlockHost`.

    A bad spec raises an ``sgl_core.errors`` error before any byte moves (vLLM
    asserts on ``False``, so a refusal is never silent); the moves run on the
    caller's thread and stream (docs/vllm.md, "The worker").
    """

    def __init__(self, host: BlockHost) -> None:
        self.host = host
        self._done: list[_Job] = []

    def _rows(self, gpu_spec: Any, cpu_spec: Any) -> BlockRows:
        for name, spec in (("GPU", gpu_spec), ("CPU", cpu_spec)):
            if not hasattr(spec, "block_ids"):
                raise ArgumentTypeError(
                    f"{name} spec {type(spec).__name__} has no block_ids (not a block spec)"
                )
        sizes = getattr(gpu_spec, "group_sizes", None)
        starts = getattr(gpu_spec, "block_indices", None)
        if sizes is None or starts is None:
            raise ArgumentTypeError(
                f"GPU spec {type(gpu_spec).__name__} has no group_sizes/block_indices"
            )
        return self.host.rows(gpu_spec.block_ids, cpu_spec.block_ids, sizes, starts)

    def _run(self, job_id: int, rows: BlockRows, store: bool) -> bool:
        move = self.host.store if store else self.host.load
        start = time.perf_counter()
        move(rows)
        self._done.append(_Job(job_id, rows.num_bytes, time.perf_counter() - start))
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """GPU blocks -> CPU chunks (all layers)."""
        return self._run(job_id, self._rows(src_spec, dst_spec), store=True)

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        """CPU chunks -> GPU blocks, one per-layer load per layer."""
        return self._run(job_id, self._rows(dst_spec, src_spec), store=False)

    def get_finished(self) -> list[Any]:
        """``TransferResult`` of every job done since the last call."""
        if not self._done:
            return []
        self.host.synchronize()
        result = _vllm(_BASE).TransferResult
        done, self._done = self._done, []
        return [result(j.job_id, True, j.num_bytes, j.seconds) for j in done]

    def wait(self, job_ids: set[int]) -> None:
        """Jobs run when submitted: wait for the pool's stream, if any."""
        self.host.synchronize()

    def shutdown(self) -> None:
        self._done.clear()


class SglOffloadingSpec:
    """An out-of-tree vLLM ``OffloadingSpec`` (``spec_name: "SglOffloadingSpec"``).

    Its ``kv_connector_extra_config`` keys (``cpu_bytes_to_use`` required) are
    listed in docs/vllm.md.
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        cpu = _vllm("vllm.v1.kv_offload.cpu.spec").CPUOffloadingSpec
        definitions: dict[str, Any] = cpu.build_metric_definitions(extra_config)
        return definitions

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        keys: tuple[str, ...] = _vllm(
            "vllm.v1.kv_offload.cpu.common"
        ).CPUOffloadingInfo.config_info_keys()
        return keys

    def __init__(self, config: Any) -> None:
        # vLLM's base initializer sets what its scheduler reads (config,
        # extra_config, tokens_per_block, blocks_per_chunk, kv_events_config, ...).
        _vllm(_BASE).OffloadingSpec.__init__(self, config)
        self.config: Any = config
        self.extra_config: Any = config.extra_config
        self.blocks_per_chunk: int = int(config.cache.blocks_per_chunk)
        self.kv_events_config: Any
        if config.canonical_layout:
            raise UnsupportedLayoutError(
                "canonical_layout is not supported by SglOffloadingSpec (direct layout only)"
            )
        cpu_bytes = positive_int(
            "kv_connector_extra_config.cpu_bytes_to_use", self.extra_config.get("cpu_bytes_to_use")
        )
        world = max(int(config.parallel.world_size), 1)
        self.kv_bytes_per_chunk = (
            int(config.worker_kv_bytes_per_block) * world * self.blocks_per_chunk
        )
        self.num_chunks = cpu_bytes // self.kv_bytes_per_chunk if self.kv_bytes_per_chunk else 0
        self._manager: Any = None
        self._worker: SglOffloadingWorker | None = None

    def get_manager(self) -> Any:
        """vLLM's ``CPUOffloadingManager`` over ``num_chunks`` chunk slots."""
        if self._manager is None:
            common = _vllm("vllm.v1.kv_offload.cpu.common")
            manager = _vllm("vllm.v1.kv_offload.cpu.manager")
            extra = self.extra_config
            self._manager = manager.CPUOffloadingManager(
                num_chunks=self.num_chunks,
                cache_policy=extra.get("eviction_policy", "lru"),
                cache_policy_module_path=extra.get("cache_policy_module_path"),
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(extra.get("store_threshold", 0)),
                max_tracker_size=int(extra.get("max_tracker_size", 64_000)),
                info=common.CPUOffloadingInfo.from_config(
                    self.config, self.num_chunks, self.kv_bytes_per_chunk
                ),
            )
        return self._manager

    def get_worker(self, kv_caches: Any) -> SglOffloadingWorker:
        """Our worker over vLLM's ``CanonicalKVCaches``, checked before anything is allocated."""
        if self._worker is None:
            groups = kv_caches.group_data_refs
            if len(groups) != 1:
                raise UnsupportedLayoutError(
                    f"one KV cache group is supported, got {len(groups)} (hybrid models)"
                )
            refs = sorted(ref.tensor_idx for ref in groups[0])
            if refs != list(range(len(kv_caches.tensors))):
                raise PoolMismatchError(
                    f"the group's layers must map to tensors 0..{len(kv_caches.tensors) - 1} "
                    f"once each, got {refs}"
                )
            if self.num_chunks <= 0:
                raise PoolMismatchError(
                    f"cpu_bytes_to_use holds no chunk of {self.kv_bytes_per_chunk} bytes"
                )
            view = BlockDeviceView.of_tensors(
                [t.tensor for t in kv_caches.tensors],
                [t.page_size_bytes for t in kv_caches.tensors],
                kv_dtype(self.config.model.dtype),
            )
            extra = self.extra_config
            host = BlockHost(
                view,
                num_chunks=self.num_chunks,
                blocks_per_chunk=self.blocks_per_chunk,
                backend=extra.get("sgl_backend"),
                layout=extra.get("sgl_host_layout"),
                io_backend=extra.get("sgl_io_backend"),
            )
            self._worker = SglOffloadingWorker(host)
        return self._worker


if _BASE in sys.modules:  # loaded by vLLM (its factory imported the base first)
    register_with_vllm()
