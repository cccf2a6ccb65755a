"""Hooks and helpers of the MHA conformance checks (a base of ``BackendConformanceSuite``).

Every MHA check runs each (layout, io backend) of ``backend.supported_mha_pairs``
and skips, cleanly, a backend that builds no MHA pools (empty pairs). Two
V widths run: ``v_head_dim`` equal to ``head_dim`` and ``mha_v_head_dim``
(K and V then live in separate host tensors).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pytest
import torch

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._kv_protocols import MHADevicePool, MHAHostPool
from sgl_core._protocols import Backend
from sgl_core.testing._helpers import page_indices
from sgl_core.testing._mha_helpers import fill_mha_device_random, mha_device_rows, mha_host_bytes
from sgl_core.testing._suite_base import Pair, SuiteBase

__all__ = ["MHASuiteBase"]


class MHASuiteBase(SuiteBase):
    """MHA class attributes a backend may override, the MHA pool hook, shared helpers."""

    head_num: ClassVar[int] = 2
    head_dim: ClassVar[int] = 16
    #: The second V width the checks run (besides ``head_dim``).
    mha_v_head_dim: ClassVar[int] = 8

    def make_mha_device_pool(
        self, backend: Backend, *, page_size: int, pages: int, v_head_dim: int | None = None
    ) -> MHADevicePool:
        """Build a small MHA device pool; override to pass backend-specific options."""
        return backend.create_mha_device_pool(
            size=pages * page_size,
            page_size=page_size,
            dtype=self.dtype,
            head_num=self.head_num,
            head_dim=self.head_dim,
            layer_num=self.layer_num,
            v_head_dim=v_head_dim,
        )

    def mha_pairs(self, backend: Backend) -> Iterator[Pair]:
        """Every MHA pair of the backend; skips the test when there is none."""
        pairs = backend.supported_mha_pairs
        if not pairs:
            pytest.skip(f"backend {backend.name!r} builds no MHA pools")
        for layout, ios in pairs.items():
            for io in sorted(ios, key=lambda member: member.value):
                yield layout, io

    def v_dims(self) -> tuple[int | None, int]:
        return (None, self.mha_v_head_dim)

    def mha_build(
        self,
        backend: Backend,
        layout: HostLayout,
        page_size: int,
        seed: int = 0,
        v_head_dim: int | None = None,
    ) -> tuple[MHADevicePool, MHAHostPool]:
        dev = self.make_mha_device_pool(
            backend, page_size=page_size, pages=self.device_pages, v_head_dim=v_head_dim
        )
        fill_mha_device_random(dev, seed)
        host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=2.0)
        return dev, host

    def mha_round_trip(
        self,
        backend: Backend,
        pair: Pair,
        page_size: int,
        dev_pages: list[int],
        host_pages: list[int],
        v_head_dim: int | None = None,
    ) -> None:
        """Backup pages, reload them per layer into a second pool, compare bytes.

        Host pages and device slots outside the transfer must keep their bytes.
        """
        layout, io = pair
        src, host = self.mha_build(backend, layout, page_size, seed=1, v_head_dim=v_head_dim)
        dst = self.make_mha_device_pool(
            backend, page_size=page_size, pages=self.device_pages, v_head_dim=v_head_dim
        )
        fill_mha_device_random(dst, 2)
        d_idx = page_indices(dev_pages, page_size)
        h_idx = page_indices(host_pages, page_size)
        before_host = mha_host_bytes(host)
        host.backup_from_device_all_layer(src, h_idx, d_idx, io)
        after_host = mha_host_bytes(host)
        what = f"MHA {layout.value}/{io.value} page_size={page_size} v_head_dim={v_head_dim}"
        for page in range(host.size // page_size):
            if page not in host_pages:
                assert torch.equal(before_host[page], after_host[page]), f"{what}: host {page}"
        all_slots = torch.arange(dst.size + dst.page_size, dtype=torch.int64)
        untouched = torch.ones(all_slots.numel(), dtype=torch.bool)
        untouched[d_idx] = False
        dst_before = [mha_device_rows(dst, layer, all_slots) for layer in range(self.layer_num)]
        for layer in range(self.layer_num):
            host.load_to_device_per_layer(dst, h_idx, d_idx, layer, io)
        for layer in range(self.layer_num):
            expected = mha_device_rows(src, layer, d_idx)
            assert torch.equal(expected, mha_device_rows(dst, layer, d_idx)), f"{what}: {layer}"
            now = mha_device_rows(dst, layer, all_slots)
            assert torch.equal(now[untouched], dst_before[layer][untouched]), f"{what}: slot"

    @staticmethod
    def io_not_in(backend: Backend, layout: HostLayout) -> list[IOBackend]:
        return [b for b in IOBackend if b not in backend.supported_mha_pairs[layout]]
