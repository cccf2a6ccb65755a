"""``SglPageStoreTier``: our L3 page stores as vLLM 0.33's secondary offloading tier.

vLLM's ``TieringOffloadingSpec`` keeps a CPU primary tier (its shared mmap
region, one *chunk row* per offloaded chunk) and hands each configured
secondary tier a memoryview of those rows: tiers never see the GPU, every byte
passes through the CPU tier. Its ``SecondaryTierFactory`` finds a tier by
``type`` (our class name) in ``module_path`` and asserts ``issubclass(cls,
SecondaryTierManager)``. This module imports nothing from vLLM at import time
(an import-linter contract forbids it): the tier is registered as a *virtual*
subclass of vLLM's ABC once vLLM's offloading base is loaded (always the case
when vLLM's factory imports us), and vLLM's classes are reached with
``importlib`` inside the calls.

Each chunk row is one page of our store under our page record: the
:class:`~sgl_core.l3.PageFormat` of :class:`ChunkRows` names everything that
gives the row's bytes their meaning (model, KV dtype, tokens per block and per
chunk, layers, worker bytes per block, parallel sizes, replicated and
canonical layouts, the row size), so a chunk of another model, dtype or block
layout is filed elsewhere: a miss, never a hit. A read is checked (format
digest, key digest, length, CRC-32): the file store checks it in a staging
buffer before a byte reaches the primary row; Mooncake reads zero-copy into
the row and, on a failed check, puts the row's old bytes back
(``restore_on_failed_get``, on by default). A bad record is a failed
promotion, which vLLM turns into a miss (``complete_write(..., False)``).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch

from sgl_core.errors import ArgumentTypeError, IndexOutOfRangeError, PoolMismatchError
from sgl_core.integrations.vllm._blocks import kv_dtype
from sgl_core.kv.protocols._kv_protocols import KVHostPool
from sgl_core.l3 import FilePageStore, MooncakeConfig, MooncakePageStore, PageStore

__all__ = ["ChunkRows", "SglPageStoreTier", "chunk_format_fields", "register_tier_with_vllm"]

logger = logging.getLogger(__name__)

_BASE = "vllm.v1.kv_offload.base"
_TIER_BASE = "vllm.v1.kv_offload.tiering.base"
_HIT_SOURCE = "vllm.v1.metrics.cache_hit_source"

#: The ``layout`` of a chunk row (its byte order is vLLM's CPU worker's).
CHUNK_LAYOUT = "vllm_chunk_row"


def _vllm(module: str) -> Any:
    return importlib.import_module(module)


def register_tier_with_vllm() -> None:
    """Make :class:`SglPageStoreTier` a virtual subclass of vLLM's ``SecondaryTierManager``."""
    _vllm(_TIER_BASE).SecondaryTierManager.register(SglPageStoreTier)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ArgumentTypeError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class ChunkRows:
    """vLLM's primary-tier chunk rows as the host pool of a page store.

    ``view`` is the memoryview vLLM hands a secondary tier: ``(num_chunks,
    row_bytes)``, row ``c`` = chunk ``c`` (every worker's slot, then padding).
    One page is one row (``page_size`` tokens, one memory object); token
    ``t`` belongs to chunk ``t // page_size``. The rows are not copied: page
    stores write into and read from vLLM's mmap. Only the L3 helpers of a host
    pool are here (``get_page_buffer_meta``, ``get_contiguous_buf_infos`` and
    the format attributes): that is all a page store uses.
    """

    layout: str = CHUNK_LAYOUT

    def __init__(
        self,
        view: memoryview,
        *,
        tokens_per_chunk: int,
        layer_num: int,
        dtype: torch.dtype,
        fields: Mapping[str, object],
    ) -> None:
        if not isinstance(view, memoryview):
            raise ArgumentTypeError(f"primary_kv_view must be a memoryview, got {type(view)}")
        if view.readonly or view.ndim != 2 or view.strides is None or view.shape is None:
            raise PoolMismatchError("primary_kv_view must be a writable 2-D memoryview")
        rows, width = view.shape
        if rows <= 0 or view.strides != (width * view.itemsize, view.itemsize):
            raise PoolMismatchError(
                f"primary_kv_view must hold >= 1 contiguous rows, got shape {view.shape} "
                f"strides {view.strides}"
            )
        self.page_size = _positive("tokens_per_chunk", tokens_per_chunk)
        self.layer_num = _positive("layer_num", layer_num)
        self.dtype = dtype
        self.num_chunks = int(rows)
        self.row_bytes = int(width * view.itemsize)
        self.size = self.num_chunks * self.page_size
        array = np.asarray(view)  # shares the mmap; released right away (no held export)
        self._base = int(array.ctypes.data)
        del array
        self._fields = dict(fields)

    def page_format_fields(self) -> dict[str, object]:
        """What gives a row's bytes their meaning beyond layout, dtype and sizes."""
        return dict(self._fields)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """Address and size of each row of the whole pages ``indices`` (checked by the store)."""
        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        chunks = (idx[:: self.page_size] // self.page_size).tolist()
        return [self._base + c * self.row_bytes for c in chunks], [self.row_bytes] * len(chunks)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """The one buffer (every row), for a transfer engine to register."""
        return [self._base], [self.num_chunks * self.row_bytes], [self.row_bytes]

    def tokens(self, chunk_ids: Iterable[int]) -> torch.Tensor:
        """Token indices of the pages of ``chunk_ids`` (checked: ints in range)."""
        chunks = np.asarray(list(chunk_ids))
        if chunks.size and not np.issubdtype(chunks.dtype, np.integer):
            raise ArgumentTypeError(f"chunk ids must be ints, got {chunks.dtype}")
        chunks = chunks.astype(np.int64).reshape(-1)
        if chunks.size and (chunks.min() < 0 or chunks.max() >= self.num_chunks):
            raise IndexOutOfRangeError(f"chunk ids must lie in [0, {self.num_chunks})")
        ps = self.page_size
        return torch.from_numpy((chunks[:, None] * ps + np.arange(ps, dtype=np.int64)).ravel())

    def as_host_pool(self) -> KVHostPool:
        # Page stores use only the L3 helpers above (their module docstring);
        # the transfer half of the host-pool protocol has no meaning here.
        return cast(KVHostPool, self)


def chunk_format_fields(spec: Any) -> dict[str, object]:
    """The fields of a chunk row's page format, from vLLM's spec (``TieringOffloadingSpec``)."""
    config = spec.config
    parallel = config.parallel
    return {
        "engine": "vllm",
        "model": str(config.model.name),
        "groups": [
            [int(g.tokens_per_block), [str(n) for n in g.layer_names], int(g.group_id)]
            for g in config.groups
        ],
        "tokens_per_hash": int(config.cache.tokens_per_hash),
        "blocks_per_chunk": int(spec.blocks_per_chunk),
        "worker_kv_bytes_per_block": int(config.worker_kv_bytes_per_block),
        "cpu_page_size_per_worker": int(getattr(spec, "cpu_page_size_per_worker", 0)),
        "parallel": [
            int(parallel.world_size),
            int(parallel.tp_size),
            int(parallel.pp_size),
            int(parallel.pcp_size),
            int(parallel.dcp_size),
        ],
        "replicated_layout": bool(getattr(spec, "replicated_layout", False)),
        "canonical_layout": bool(config.canonical_layout),
        "kv_cache_layout": None if config.kv_cache_layout is None else str(config.kv_cache_layout),
    }


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
            capacity_bytes = _positive("capacity_bytes", capacity_bytes)
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
    """A vLLM ``SecondaryTierManager`` over one of our page stores (see the module docstring).

    Tier config (``kv_connector_extra_config.secondary_tiers[i]``): ``"type":
    "SglPageStoreTier"``, ``"module_path": "sgl_core.integrations.vllm"``,
    ``"store"``: ``"file"`` (with ``root_dir``, optional ``capacity_bytes``,
    ``fsync``) or ``"mooncake"`` (with ``mooncake``: the
    :class:`~sgl_core.l3.MooncakeConfig` fields); ``threads`` (I/O threads,
    default 2); ``locality`` (``"LOCAL"``/``"REMOTE"``).

    ``submit_store`` / ``submit_load`` check the job and return at once; the
    copies run on the tier's threads and are reported by
    ``get_finished_jobs``. A job's chunk rows stay pinned by vLLM until then.
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
        n_threads = _positive("threads", threads)
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


if _BASE in sys.modules:  # vLLM is loaded (its tier factory imported its bases first)
    register_tier_with_vllm()
