"""``SglPageStoreTier``: our L3 page stores as vLLM 0.33's secondary offloading tier.

Imports nothing from vLLM at import time (an import-linter contract): the tier
becomes a *virtual* ``SecondaryTierManager`` once vLLM's offloading base is
loaded (``_spec`` registers it). Its page records and jobs: docs/vllm.md.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from sgl_core.errors import ArgumentTypeError, IndexOutOfRangeError, PoolMismatchError
from sgl_core.integrations.vllm._blocks import kv_dtype
from sgl_core.integrations.vllm._chunk_rows import ChunkRows, chunk_format_fields, positive_int
from sgl_core.l3 import FilePageStore, MooncakeConfig, MooncakePageStore, PageStore

__all__ = ["SglPageStoreTier"]

logger = logging.getLogger(__name__)

_BASE = "vllm.v1.kv_offload.base"
_TIER_BASE = "vllm.v1.kv_offload.tiering.base"
_HIT_SOURCE = "vllm.v1.metrics.cache_hit_source"


def _vllm(module: str) -> Any:
    return importlib.import_module(module)


def _make_store(
    store: object,
    root_dir: object,
    capacity_bytes: object,
    fsync: object,
    mooncake: object,
) -> tuple[PageStore, bool]:
    """The page store a tier config names; ``(store, owned)``."""
    if isinstance(store, PageStore) and not isinstance(store, str):
        return store, False  # an instance (in-process configs)
    if store == "file":
        if not isinstance(root_dir, str) or not root_dir:
            raise ArgumentTypeError(f"store 'file' needs root_dir (a path), got {root_dir!r}")
        if capacity_bytes is not None:
            capacity_bytes = positive_int("capacity_bytes", capacity_bytes)
        if not isinstance(fsync, bool):
            raise ArgumentTypeError(f"fsync must be a bool, got {fsync!r}")
        return FilePageStore(root_dir, capacity_bytes, fsync=fsync), True
    if store == "mooncake":
        if not isinstance(mooncake, Mapping):
            raise ArgumentTypeError(
                f"store 'mooncake' needs mooncake (MooncakeConfig fields), got {mooncake!r}"
            )
        return MooncakePageStore(MooncakeConfig(**mooncake)), True
    raise ArgumentTypeError(f"store must be 'file', 'mooncake' or a PageStore, got {store!r}")


@dataclass
class _Job:
    future: Future[tuple[list[bool], float]]
    keys: list[Any]
    is_load: bool


class SglPageStoreTier:
    """A vLLM ``SecondaryTierManager`` over one of our page stores (tier keys and jobs:
    docs/vllm.md). A job's copies run on the tier's threads; vLLM keeps its chunk
    rows pinned until ``get_finished_jobs`` reports it.
    """

    tolerates_off_thread_polling: ClassVar[bool] = False

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        return {}

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ()

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        *,
        store: object = "file",
        root_dir: object = None,
        capacity_bytes: object = None,
        fsync: object = False,
        mooncake: object = None,
        threads: object = 2,
        locality: str | None = None,
    ) -> None:
        # vLLM's initializer sets what its tiering manager reads (block size, tier_type, ...).
        self._bp_detector: Any = None
        _vllm(_TIER_BASE).SecondaryTierManager.__init__(
            self, offloading_spec, primary_kv_view, tier_type, backpressure_detector
        )
        base = _vllm(_BASE)
        self.medium: Any = base.Medium.STORAGE
        self.cache_hit_source: Any = _vllm(_HIT_SOURCE).CacheHitSource.DISK
        self.locality: Any = None if locality is None else base.Locality(locality)
        n_threads = positive_int("threads", threads)
        config = offloading_spec.config
        row = int(getattr(offloading_spec, "kv_bytes_per_chunk", 0))
        if primary_kv_view.strides is None or primary_kv_view.strides[0] != row:
            raise PoolMismatchError(
                f"primary_kv_view rows are not the spec's {row}-byte chunks "
                f"(strides {primary_kv_view.strides})"
            )
        if not config.groups:
            raise PoolMismatchError("the offloading config has no KV cache group")
        # a row's token count only sizes our page; the groups are in the format
        tokens = int(config.groups[0].tokens_per_block) * int(offloading_spec.blocks_per_chunk)
        self.rows = ChunkRows(
            primary_kv_view,
            tokens_per_chunk=tokens,
            layer_num=sum(len(g.layer_names) for g in config.groups),
            dtype=kv_dtype(config.model.dtype),
            fields=chunk_format_fields(offloading_spec),
        )
        self.store, self._owns_store = _make_store(store, root_dir, capacity_bytes, fsync, mooncake)
        self.store.register_host_pool(self.rows.as_host_pool())
        self._pool = ThreadPoolExecutor(n_threads, thread_name_prefix="sgl_vllm_tier")
        self._jobs: dict[int, _Job] = {}
        self._lock = threading.Lock()

    # vLLM's SecondaryTierManager properties (a virtual subclass inherits none)
    @property
    def block_size_bytes(self) -> int:
        return self.rows.row_bytes

    @property
    def bp_detector(self) -> Any:
        return self._bp_detector

    @staticmethod
    def store_key(key: bytes) -> str:
        """Our page key of vLLM's ``OffloadKey`` (the page format covers the model)."""
        if not isinstance(key, bytes) or not key:
            raise ArgumentTypeError(f"offload keys must be non-empty bytes, got {key!r}")
        return key.hex()

    def lookup(self, key: bytes, req_context: Any) -> Any:
        """HIT when the store holds the chunk whole under this format, else MISS."""
        hit = self.store.batch_exists([self.store_key(key)]) == 1
        result = _vllm(_BASE).LookupResult
        return result.HIT if hit else result.MISS

    def _submit(self, job: Any, is_load: bool) -> None:
        keys = list(job.keys)
        names = [self.store_key(k) for k in keys]
        tokens = self.rows.tokens(job.chunk_ids)
        if tokens.numel() != len(names) * self.rows.page_size:
            raise IndexOutOfRangeError(
                f"job {job.job_id}: {len(names)} keys but "
                f"{tokens.numel() // self.rows.page_size} chunk ids"
            )
        with self._lock:
            if job.job_id in self._jobs:
                raise ArgumentTypeError(f"job {job.job_id} is already in flight")
            move = self.store.batch_get if is_load else self.store.batch_set
            self._jobs[job.job_id] = _Job(
                self._pool.submit(_timed, move, names, tokens), keys, is_load
            )

    def submit_store(self, job_metadata: Any) -> None:
        """Primary rows -> store, on the tier's threads (rows already stored are skipped)."""
        self._submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: Any) -> None:
        """Store -> primary rows, each record verified before its row is written."""
        self._submit(job_metadata, is_load=True)

    def get_finished_jobs(self) -> list[Any]:
        """``JobResult`` of each job done; a load keeps the chunks that verified."""
        with self._lock:
            done = {i: j for i, j in self._jobs.items() if j.future.done()}
            for i in done:
                del self._jobs[i]
        result_cls = _vllm(_TIER_BASE).JobResult
        out = []
        for job_id, job in done.items():
            try:
                ok, seconds = job.future.result()
            except Exception:  # a store failure is a failed job, never a hit
                logger.exception("SglPageStoreTier: job %d failed", job_id)
                ok, seconds = [False] * len(job.keys), 0.0
            success = len(ok) == len(job.keys) and all(ok)
            kept = [k for k, good in zip(job.keys, ok, strict=False) if good]
            out.append(
                result_cls(
                    job_id=job_id,
                    success=success,
                    successful_keys=tuple(kept) if job.is_load and not success and kept else None,
                    transfer_time=seconds,
                    transfer_bytes=len(kept) * self.rows.row_bytes,
                )
            )
        return out

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished (none is cancelled mid-copy)."""
        with self._lock:
            futures = [j.future for j in self._jobs.values()]
        wait_futures(futures)

    def on_new_request(self, req_context: Any) -> Any:
        return _vllm(_BASE).RequestOffloadingContext()

    def on_request_finished(self, req_context: Any) -> None:
        return None

    def touch(self, keys: Collection[bytes], req_context: Any) -> None:
        return None

    def take_events(self) -> Iterable[Any]:
        return ()

    def serve_external_requests(self, parent: Any) -> None:
        return None

    def on_schedule_end(self, context: Any) -> None:
        return None

    def get_stats(self) -> None:
        return None

    def config_info(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:
        """Finish the jobs in flight, stop the threads, close a store this tier built."""
        self.drain_jobs()
        self._pool.shutdown(wait=True)
        if self._owns_store:
            close = getattr(self.store, "close", None)
            if close is not None:
                close()


def _timed(move: Any, names: list[str], tokens: torch.Tensor) -> tuple[list[bool], float]:
    start = time.perf_counter()
    ok: list[bool] = move(names, tokens)
    return ok, time.perf_counter() - start
