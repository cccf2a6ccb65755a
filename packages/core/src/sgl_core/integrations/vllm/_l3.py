"""vLLM's offloaded chunks in our L3 page stores, with our page records (no vLLM import).

Each host page of a :class:`BlockHost` is one vLLM block of every layer, so a
page store registered on its pool (``FilePageStore``, ``MooncakePageStore``)
keeps each block as one page under our record: the page format (layout,
dtype, page size, layers, row dims) and a checksum are checked before a byte
reaches the pool, so a block of another dtype, host layout or block size is a
miss. What the format cannot see (another model of the same shapes) is the
key's job: keys are ``<model>@<offload key hex>.<j>of<blocks per chunk>``
(vLLM keys a chunk by the hash at its end, so sub-block ``j`` of a 2-block
chunk is another block than sub-block ``j`` of a 1-block one), the model name
escaped so that no name forges another's prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sgl_core.errors import ArgumentTypeError
from sgl_core.integrations.vllm._blocks import BlockHost, chunk_slots
from sgl_core.l3 import PageStore

__all__ = ["BlockStore"]


def _escape(model: str) -> str:
    return model.replace("%", "%25").replace("@", "%40")


class BlockStore:
    """A page store over a :class:`BlockHost`'s pool, addressed by vLLM's chunk keys."""

    def __init__(self, host: BlockHost, store: PageStore, model: str) -> None:
        if not isinstance(model, str) or not model:
            raise ArgumentTypeError(f"model must be a non-empty str, got {model!r}")
        self.host = host
        self.store = store
        self.prefix = _escape(model) + "@"
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
