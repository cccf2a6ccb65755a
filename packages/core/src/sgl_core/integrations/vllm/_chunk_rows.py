"""vLLM's offloaded chunks as pages of our L3 stores (no vLLM import): docs/vllm.md,
"Our page records" (:class:`ChunkRows`, :func:`chunk_format_fields`, :class:`BlockStore`).

What the format cannot see (another model of the same shapes) is the key's job: vLLM
keys a chunk by the hash at its end, so sub-block ``j`` of a 2-block chunk is another
block than sub-block ``j`` of a 1-block one (hence ``.<j>of<blocks per chunk>``), and
the model name is escaped so that no name forges another's prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch

from sgl_core.errors import ArgumentTypeError, PoolMismatchError
from sgl_core.integrations.vllm._blocks import BlockHost, chunk_slots
from sgl_core.kv.protocols._kv_protocols import KVHostPool
from sgl_core.l3 import PageStore

__all__ = ["BlockStore", "CHUNK_LAYOUT", "ChunkRows", "chunk_format_fields", "positive_int"]

#: The ``layout`` of a chunk row (its byte order is vLLM's CPU worker's).
CHUNK_LAYOUT = "vllm_chunk_row"


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ArgumentTypeError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class ChunkRows:
    """vLLM's primary-tier chunk rows (``view``: ``(num_chunks, row_bytes)``, row ``c``
    = chunk ``c``) as the host pool of a page store, without a copy.

    One page is one row (``page_size`` tokens, one memory object). Only the L3
    helpers of a host pool are here: that is all a page store uses.
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
        self.page_size = positive_int("tokens_per_chunk", tokens_per_chunk)
        self.layer_num = positive_int("layer_num", layer_num)
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
        chunks = np.asarray(list(chunk_ids)).reshape(-1)
        return chunk_slots("chunk ids", chunks, self.num_chunks, self.page_size)

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


class BlockStore:
    """A page store over a :class:`BlockHost`'s pool, addressed by vLLM's chunk keys."""

    def __init__(self, host: BlockHost, store: PageStore, model: str) -> None:
        if not isinstance(model, str) or not model:
            raise ArgumentTypeError(f"model must be a non-empty str, got {model!r}")
        self.host = host
        self.store = store
        self.prefix = model.replace("%", "%25").replace("@", "%40") + "@"
        store.register_host_pool(host.pool)

    def keys(self, offload_keys: Sequence[bytes]) -> list[str]:
        """Our store keys of vLLM ``OffloadKey`` chunks: one per sub-block."""
        out = []
        for key in offload_keys:
            if not isinstance(key, bytes) or not key:
                raise ArgumentTypeError(f"offload keys must be non-empty bytes, got {key!r}")
            per = self.host.blocks_per_chunk
            out += [f"{self.prefix}{key.hex()}.{j}of{per}" for j in range(per)]
        return out

    def _pages(self, chunk_ids: Sequence[int]) -> torch.Tensor:
        n, per = self.host.num_chunks, self.host.blocks_per_chunk
        return chunk_slots("CPU chunk ids", list(chunk_ids), n, per)

    def save(self, offload_keys: Sequence[bytes], chunk_ids: Sequence[int]) -> list[bool]:
        """Host chunks -> store; one bool per page."""
        return self.store.batch_set(self.keys(offload_keys), self._pages(chunk_ids))

    def stored_prefix(self, offload_keys: Sequence[bytes]) -> int:
        """How many leading chunks are stored whole (every sub-block page)."""
        found = self.store.batch_exists(self.keys(offload_keys))
        return found // self.host.blocks_per_chunk

    def fetch(self, offload_keys: Sequence[bytes], chunk_ids: Sequence[int]) -> list[bool]:
        """Store -> host chunks, each page verified before it is copied; one bool per page."""
        return self.store.batch_get(self.keys(offload_keys), self._pages(chunk_ids))
