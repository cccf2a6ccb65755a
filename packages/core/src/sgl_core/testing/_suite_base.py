"""Hooks and helpers every conformance check shares (a base of ``BackendConformanceSuite``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch

from sgl_core._discovery import get_backend
from sgl_core._enums import HostLayout, IOBackend
from sgl_core._kv_protocols import MLADevicePool, MLAHostPool
from sgl_core._protocols import Backend
from sgl_core.testing._helpers import (
    device_rows,
    fill_device_random,
    host_bytes,
    page_indices,
)

Pair = tuple[HostLayout, IOBackend]


__all__ = ["Pair", "SuiteBase"]


class SuiteBase:
    """Class attributes a backend may override, the pool hooks, and shared helpers."""

    backend_name: ClassVar[str] = "torch"
    dtype: ClassVar[torch.dtype] = torch.bfloat16
    layer_num: ClassVar[int] = 3
    kv_lora_rank: ClassVar[int] = 16
    qk_rope_head_dim: ClassVar[int] = 8
    device_pages: ClassVar[int] = 6
    page_sizes: ClassVar[tuple[int, ...]] = (1, 16, 64)
    #: False where transfers cannot run from two threads (e.g. Triton's interpreter).
    concurrent_transfers: ClassVar[bool] = True
    #: Packed rows: each row ``kv_cache_dim`` elements of ``dtype`` (None: the rank split).
    kv_cache_dim: ClassVar[int | None] = None
    #: The indexer cache of the device pools (None: no indexer).
    index_head_dim: ClassVar[int | None] = None
    indexer_layer_ids: ClassVar[tuple[int, ...] | None] = None
    with_index_k_scale: ClassVar[bool] = False

    # ----------------------------------------------------------------- hooks
    @pytest.fixture
    def backend(self) -> Backend:
        return get_backend(self.backend_name)

    def make_device_pool(self, backend: Backend, *, page_size: int, pages: int) -> MLADevicePool:
        """Build a small device pool; override to pass backend-specific options."""
        return backend.create_device_pool(
            size=pages * page_size,
            page_size=page_size,
            dtype=self.dtype,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            layer_num=self.layer_num,
            **self.row_options(),
        )

    def row_options(self) -> dict[str, Any]:
        """The packed-row and indexer arguments of this class's device pools (only those set)."""
        options: dict[str, Any] = {}
        if self.kv_cache_dim is not None:
            options["kv_cache_dim"] = self.kv_cache_dim
        if self.index_head_dim is not None:
            options["index_head_dim"] = self.index_head_dim
            options["indexer_layer_ids"] = self.indexer_layer_ids
            options["with_index_k_scale"] = self.with_index_k_scale
        return options

    # --------------------------------------------------------------- helpers
    def pairs(self, backend: Backend) -> Iterator[Pair]:
        for layout, ios in backend.supported_pairs.items():
            for io in sorted(ios, key=lambda member: member.value):
                yield layout, io

    def build(
        self, backend: Backend, layout: HostLayout, page_size: int, seed: int = 0
    ) -> tuple[MLADevicePool, MLAHostPool]:
        dev = self.make_device_pool(backend, page_size=page_size, pages=self.device_pages)
        fill_device_random(dev, seed)
        host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=2.0)
        return dev, host

    def round_trip(
        self,
        backend: Backend,
        layout: HostLayout,
        io: IOBackend,
        page_size: int,
        dev_pages: list[int],
        host_pages: list[int],
    ) -> None:
        """Backup pages, reload them per layer into a second pool, compare bytes."""
        src, host = self.build(backend, layout, page_size, seed=1)
        dst = self.make_device_pool(backend, page_size=page_size, pages=self.device_pages)
        fill_device_random(dst, 2)
        d_idx = page_indices(dev_pages, page_size)
        h_idx = page_indices(host_pages, page_size)
        before_host = host_bytes(host)
        host.backup_from_device_all_layer(src, h_idx, d_idx, io)
        after_host = host_bytes(host)
        for page in range(host.size // page_size):
            if page not in host_pages:
                assert torch.equal(before_host[page], after_host[page]), f"host page {page} touched"
        all_slots = torch.arange(dst.size + dst.page_size, dtype=torch.int64)
        untouched = torch.ones(all_slots.numel(), dtype=torch.bool)
        untouched[d_idx] = False
        dst_before = [device_rows(dst, layer, all_slots) for layer in range(self.layer_num)]
        for layer in range(self.layer_num):
            host.load_to_device_per_layer(dst, h_idx, d_idx, layer, io)
        for layer in range(self.layer_num):
            expected = device_rows(src, layer, d_idx)
            got = device_rows(dst, layer, d_idx)
            assert torch.equal(expected, got), (
                f"{layout.value}/{io.value} page_size={page_size}: layer {layer} differs"
            )
            now = device_rows(dst, layer, all_slots)
            assert torch.equal(now[untouched], dst_before[layer][untouched]), "device slot touched"
