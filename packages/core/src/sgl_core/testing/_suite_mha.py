"""Conformance checks of MHA transfers: round trips, isolation, granularity, element types.

Part of ``BackendConformanceSuite`` (through ``MHAChecks``); a backend whose
``supported_mha_pairs`` is empty skips every one of them.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._protocols import Backend
from sgl_core.errors import UnsupportedLayoutError
from sgl_core.testing._helpers import page_indices, random_bits, same_bytes
from sgl_core.testing._mha_helpers import fill_mha_device_random, mha_device_rows, mha_snapshot
from sgl_core.testing._suite_mha_misuse import MHAMisuseChecks

__all__ = ["MHAChecks"]


class MHAChecks(MHAMisuseChecks):
    """MHA transfer checks (bad calls, concurrency and L3 pages: ``MHAMisuseChecks``)."""

    def test_mha_pairs_are_typed(self, backend: Backend) -> None:
        pairs = backend.supported_mha_pairs
        for layout, ios in pairs.items():
            assert isinstance(layout, HostLayout) and ios
            assert all(isinstance(io, IOBackend) for io in ios)
            chosen = backend.default_mha_io(layout)
            assert chosen in ios and backend.default_mha_io(layout.value) is chosen
        for layout in HostLayout:
            if layout not in pairs:
                with pytest.raises(UnsupportedLayoutError):
                    backend.default_mha_io(layout)

    @pytest.mark.parametrize("page_size", [1, 16, 64])
    def test_mha_round_trip_shuffled_pages(self, backend: Backend, page_size: int) -> None:
        if page_size not in self.page_sizes:
            pytest.skip(f"page_size {page_size} not used by this backend")
        gen = torch.Generator().manual_seed(page_size)
        total = self.device_pages + 1
        for pair in self.mha_pairs(backend):
            for v_dim in self.v_dims():
                dev_pages = torch.randperm(total, generator=gen)[:4].tolist()
                host_pages = torch.randperm(2 * self.device_pages, generator=gen)[:4].tolist()
                self.mha_round_trip(backend, pair, page_size, dev_pages, host_pages, v_dim)

    def test_mha_round_trip_contiguous_runs(self, backend: Backend) -> None:
        for pair in self.mha_pairs(backend):
            for v_dim in self.v_dims():
                self.mha_round_trip(backend, pair, 16, [1, 2, 3, 5], [4, 5, 6, 0], v_dim)

    def test_mha_page_granularity_is_what_the_pool_says(self, backend: Backend) -> None:
        ps = 16
        for layout, io in self.mha_pairs(backend):
            src, host = self.mha_build(backend, layout, ps, seed=11)
            whole = host.moves_whole_pages(io)
            assert isinstance(whole, bool) and host.moves_whole_pages(io.value) is whole
            unsupported = self.io_not_in(backend, layout)
            if unsupported:
                with pytest.raises(UnsupportedLayoutError):
                    host.moves_whole_pages(unsupported[0])
            if whole:
                continue  # the rejection of partial pages is in the bad calls
            d_idx = torch.tensor([3, 17, 18, 40], dtype=torch.int64)
            h_idx = torch.tensor([70, 5, 6, 33], dtype=torch.int64)
            host.backup_from_device_all_layer(src, h_idx, d_idx, io)
            dst = self.make_mha_device_pool(backend, page_size=ps, pages=self.device_pages)
            fill_mha_device_random(dst, 12)
            for layer in range(self.layer_num):
                host.load_to_device_per_layer(dst, h_idx, d_idx, layer, io)
                assert torch.equal(
                    mha_device_rows(src, layer, d_idx), mha_device_rows(dst, layer, d_idx)
                )

    def test_mha_load_touches_only_that_layer(self, backend: Backend) -> None:
        for layout, io in self.mha_pairs(backend):
            src, host = self.mha_build(backend, layout, 16, seed=3)
            idx = page_indices([2, 4], 16)
            host.backup_from_device_all_layer(src, idx, idx, io)
            dst = self.make_mha_device_pool(backend, page_size=16, pages=self.device_pages)
            fill_mha_device_random(dst, 4)
            slots = torch.arange(dst.size + dst.page_size, dtype=torch.int64)
            before = [mha_device_rows(dst, layer, slots) for layer in range(self.layer_num)]
            target = self.layer_num - 1
            host.load_to_device_per_layer(dst, idx, idx, target, io)
            for layer in range(self.layer_num):
                if layer != target:
                    now = mha_device_rows(dst, layer, slots)
                    assert torch.equal(now, before[layer]), f"{layout.value}: layer {layer}"
            assert torch.equal(mha_device_rows(dst, target, idx), mha_device_rows(src, target, idx))

    def test_mha_empty_transfer_is_a_no_op(self, backend: Backend) -> None:
        empty = torch.empty(0, dtype=torch.int64)
        for layout, io in self.mha_pairs(backend):
            dev, host = self.mha_build(backend, layout, 16)
            before = mha_snapshot(dev, host)
            host.backup_from_device_all_layer(dev, empty, empty, io)
            host.load_to_device_per_layer(dev, empty, empty, 0, io)
            assert same_bytes(before, mha_snapshot(dev, host))

    @pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
    def test_mha_fp8_round_trips(self, backend: Backend, fp8: str) -> None:
        """fp8 K and V move as bytes: random bit patterns (NaNs included) round-trip exactly."""
        dtype: torch.dtype = getattr(torch, fp8)
        setattr(self, "dtype", dtype)  # noqa: B010  (this test's pools only)
        pairs = list(self.mha_pairs(backend))
        dev = self.make_mha_device_pool(backend, page_size=16, pages=self.device_pages)
        assert dev.dtype == dtype
        gen = torch.Generator().manual_seed(13)
        loc = page_indices([2, 0], 16)
        k = random_bits((loc.numel(), dev.head_num, dev.head_dim), dtype, gen)
        v = random_bits((loc.numel(), dev.head_num, dev.v_head_dim), dtype, gen)
        dev.set_kv_buffer(1, loc, k, v)
        got_k, got_v = dev.get_kv_buffer(1, loc)
        assert got_k.dtype == got_v.dtype == dtype
        assert torch.equal(got_k.cpu().view(torch.uint8), k.view(torch.uint8))
        assert torch.equal(got_v.cpu().view(torch.uint8), v.view(torch.uint8))
        for pair in pairs:
            self.mha_round_trip(backend, pair, 16, [3, 1, 6], [0, 7, 2])

    @settings(
        max_examples=10,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,
        ],
    )
    @given(data=st.data())
    def test_mha_random_round_trips(self, backend: Backend, data: st.DataObject) -> None:
        pairs = list(self.mha_pairs(backend))
        pair = data.draw(st.sampled_from(pairs), label="pair")
        page_size = data.draw(st.sampled_from([p for p in self.page_sizes if p <= 16]), label="ps")
        v_dim = data.draw(st.sampled_from(self.v_dims()), label="v_head_dim")
        count = data.draw(st.integers(1, self.device_pages), label="pages")
        dev_pages = data.draw(
            st.permutations(range(self.device_pages + 1)).map(lambda p: list(p[:count]))
        )
        host_pages = data.draw(
            st.permutations(range(2 * self.device_pages)).map(lambda p: list(p[:count]))
        )
        self.mha_round_trip(backend, pair, page_size, dev_pages, host_pages, v_dim)
