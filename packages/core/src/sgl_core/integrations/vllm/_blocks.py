"""vLLM's canonical KV blocks as rows of one of our host pools (no vLLM import).

vLLM's ``(num_blocks, page_size_bytes)`` tensors, one per layer, are one
device pool whose page is one block; vLLM's null block 0 is our padding
page, so device slot ``b`` is vLLM block ``b``, and CPU chunk ``c`` is host
pages ``c * blocks_per_chunk ...`` (docs/vllm.md). Every argument is checked
before a byte moves; a rejected call changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sgl_core.backends._discovery import get_backend
from sgl_core.errors import (
    ArgumentTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    PoolMismatchError,
    UnsupportedLayoutError,
)
from sgl_core.kv.device._engine_views import as_device_pool
from sgl_core.kv.protocols._kv_protocols import MLADevicePool, MLAHostPool

__all__ = ["BlockDeviceView", "BlockHost", "BlockRows", "chunk_slots", "kv_dtype"]

_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
    "uint8": torch.uint8,
    "int8": torch.int8,
}


def kv_dtype(name: str) -> torch.dtype:
    """The torch dtype of vLLM's KV cache dtype name (``OffloadingModelConfig.dtype``)."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"KV dtype must be a str, got {type(name).__name__}")
    try:
        return _DTYPES[name.removeprefix("torch.").lower()]
    except KeyError:
        raise UnsupportedLayoutError(f"KV dtype {name!r} is not one of {sorted(_DTYPES)}") from None


@dataclass
class BlockDeviceView:
    """vLLM's canonical block tensors as an engine MLA pool (one row = one block).

    The members are those :func:`sgl_core.kv.device._foreign_pool.as_device_pool` reads;
    ``kv_buffer[l]`` is a view of canonical tensor ``l`` (same storage: our
    transfers read and write vLLM's own memory). The rank split of a row is
    arbitrary (rows move whole): ``kv_lora_rank = row - 1``, ``qk_rope_head_dim = 1``.
    """

    kv_buffer: list[torch.Tensor]
    dtype: torch.dtype
    device: str
    num_blocks: int
    page_size_bytes: int
    size: int = field(init=False)
    page_size: int = field(init=False, default=1)
    layer_num: int = field(init=False)
    kv_cache_dim: int = field(init=False)
    kv_lora_rank: int = field(init=False)
    qk_rope_head_dim: int = field(init=False, default=1)

    def __post_init__(self) -> None:
        self.size = self.num_blocks - 1
        self.layer_num = len(self.kv_buffer)
        self.kv_cache_dim = self.page_size_bytes // self.dtype.itemsize
        self.kv_lora_rank = self.kv_cache_dim - 1

    @classmethod
    def of_tensors(
        cls, tensors: Sequence[torch.Tensor], page_sizes: Sequence[int], dtype: torch.dtype
    ) -> BlockDeviceView:
        """Check vLLM's canonical tensors and view them; nothing is copied."""
        if not tensors or len(tensors) != len(page_sizes):
            raise PoolMismatchError(
                f"need one page size per canonical tensor, got {len(tensors)} tensors "
                f"and {len(page_sizes)} page sizes"
            )
        first = tensors[0]
        num_blocks, page = int(first.shape[0]) if first.ndim else 0, int(page_sizes[0])
        if num_blocks < 2:
            raise PoolMismatchError(f"KV caches need at least 2 blocks, got {num_blocks}")
        if page <= 0 or page % (2 * dtype.itemsize):
            raise UnsupportedLayoutError(
                f"page_size_bytes={page} is not a positive multiple of 2 {dtype} elements"
            )
        for i, (t, p) in enumerate(zip(tensors, page_sizes, strict=True)):
            if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int8, torch.uint8):
                raise PoolMismatchError(f"canonical tensor {i} must be an int8/uint8 tensor")
            if int(p) != page or t.ndim != 2 or tuple(t.shape) != (num_blocks, page):
                raise UnsupportedLayoutError(
                    f"canonical tensor {i} is {tuple(t.shape)} with page {p}; every tensor "
                    f"must be ({num_blocks}, {page}) (one KV group, equal pages)"
                )
            if t.stride() != (page, 1) or t.device != first.device:
                raise UnsupportedLayoutError(
                    f"canonical tensor {i} must hold its blocks contiguously on {first.device} "
                    f"(stride {(page, 1)}), got stride {t.stride()} on {t.device}"
                )
        rows = [t.view(torch.uint8).view(dtype).view(num_blocks, 1, -1) for t in tensors]
        return cls(rows, dtype, str(first.device), num_blocks, page)


@dataclass(frozen=True)
class BlockRows:
    """One checked transfer: device slots (vLLM blocks) and host pages, paired."""

    device: torch.Tensor
    host: torch.Tensor
    num_bytes: int


def _ints(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise IndexShapeError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ArgumentTypeError(f"{name} must hold ints, got {arr.dtype}")
    return arr.astype(np.int64)


def chunk_slots(name: str, chunk_ids: Any, num_chunks: int, per: int) -> torch.Tensor:
    """Slots ``c * per ... c * per + per - 1`` of each chunk ``c`` of ``chunk_ids`` (checked)."""
    chunks = _ints(name, chunk_ids)
    if chunks.size and (chunks.min() < 0 or chunks.max() >= num_chunks):
        raise IndexOutOfRangeError(f"{name} must lie in [0, {num_chunks})")
    return torch.from_numpy((chunks[:, None] * per + np.arange(per, dtype=np.int64)).ravel())


class BlockHost:
    """Our host pool over a :class:`BlockDeviceView`, addressed as vLLM's chunks."""

    def __init__(
        self,
        view: BlockDeviceView,
        *,
        num_chunks: int,
        blocks_per_chunk: int,
        backend: str | None = None,
        layout: str | None = None,
        io_backend: str | None = None,
    ) -> None:
        for name, value in (("num_chunks", num_chunks), ("blocks_per_chunk", blocks_per_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ArgumentTypeError(f"{name} must be a positive int, got {value!r}")
        self.view = view
        # The engine-pool view (a torch.device, the MLADevicePool accessors).
        self.device_pool: MLADevicePool = as_device_pool(view)
        self.num_chunks = num_chunks
        self.blocks_per_chunk = blocks_per_chunk
        self.backend = get_backend(backend)
        if layout is None:
            # page_first when the backend runs it (a page is then one contiguous
            # block of every layer: what an L3 store writes), else its first layout.
            names = sorted(str(getattr(k, "value", k)) for k in self.backend.supported_pairs)
            if not names:
                raise UnsupportedLayoutError("backend supports no host layout")
            layout = "page_first" if "page_first" in names else names[0]
        self.io_backend = io_backend if io_backend is not None else self.backend.default_io(layout)
        pages = num_chunks * blocks_per_chunk
        # Exactly ``pages`` host pages (+0.5 absorbs the float product's rounding).
        ratio = (pages + 0.5) / view.size
        self.pool: MLAHostPool = self.backend.create_host_pool(
            self.device_pool, layout=layout, host_to_device_ratio=ratio, io_backend=self.io_backend
        )
        if self.pool.size < pages:
            raise PoolMismatchError(f"host pool holds {self.pool.size} pages, need {pages}")

    def rows(
        self,
        block_ids: Any,
        chunk_ids: Any,
        group_sizes: Sequence[int],
        block_indices: Sequence[int],
    ) -> BlockRows:
        """Pair vLLM's GPU block ids with host pages of its CPU chunk ids, checked.

        As vLLM's CPU worker: group ``g`` holds ``group_sizes[g]`` GPU blocks
        starting at logical block ``block_indices[g]`` of its request, so the
        first chunk skips ``block_indices[g] % blocks_per_chunk`` sub-blocks.
        """
        blocks = _ints("GPU block_ids", block_ids)
        chunks = _ints("CPU chunk ids", chunk_ids)
        sizes = _ints("group_sizes", list(group_sizes))
        starts = _ints("block_indices", list(block_indices))
        if len(sizes) != 1 or len(starts) != 1:
            raise UnsupportedLayoutError(
                f"one KV cache group is supported, got {len(sizes)} group sizes "
                f"and {len(starts)} block indices"
            )
        size, start = int(sizes[0]), int(starts[0])
        per = self.blocks_per_chunk
        skip = start % per if start >= 0 else -1
        if size != len(blocks) or skip < 0:
            raise IndexShapeError(
                f"group size {size} (first logical block {start}) does not cover "
                f"the {len(blocks)} GPU blocks given"
            )
        if len(chunks) != -(-(size + skip) // per):
            raise IndexShapeError(
                f"{size} blocks from sub-block {skip} need {-(-(size + skip) // per)} "
                f"chunks of {per}, got {len(chunks)}"
            )
        if blocks.size and (blocks.min() < 1 or blocks.max() >= self.view.num_blocks):
            raise IndexOutOfRangeError(
                f"GPU block ids must lie in [1, {self.view.num_blocks}) (0 is the null block)"
            )
        host = chunk_slots("CPU chunk ids", chunks, self.num_chunks, per)[skip : skip + size]
        nbytes = size * self.view.layer_num * self.view.page_size_bytes
        return BlockRows(torch.from_numpy(blocks), host, nbytes)

    def store(self, rows: BlockRows) -> None:
        """Device blocks -> host pages, all layers in one call."""
        self.pool.backup_from_device_all_layer(
            self.device_pool, rows.host, rows.device, self.io_backend
        )

    def load(self, rows: BlockRows, layers: Sequence[int] | None = None) -> None:
        """Host pages -> device blocks, one call per layer (all layers by default)."""
        for layer in range(self.view.layer_num) if layers is None else layers:
            self.pool.load_to_device_per_layer(
                self.device_pool, rows.host, rows.device, layer, self.io_backend
            )

    def synchronize(self) -> None:
        """Wait for transfers the host pool queued on a stream (no-op when synchronous)."""
        self.pool.synchronize()
