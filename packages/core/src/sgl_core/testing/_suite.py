"""The backend conformance suite: one behaviour contract for every backend.

A backend package runs it against itself by subclassing::

    from sgl_core.testing import BackendConformanceSuite

    class TestMyBackend(BackendConformanceSuite):
        backend_name = "mine"

Override :meth:`make_device_pool` (and :meth:`make_mha_device_pool`) to pass
backend-specific options. The MHA checks (``test_mha_*``) run every pair of
``backend.supported_mha_pairs`` and skip a backend that has none. The
portable ``torch`` backend passes this suite and is its oracle: every check
compares raw bytes read back through the public pool API.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._protocols import Backend
from sgl_core.errors import (
    UnsupportedLayoutError,
)
from sgl_core.testing._helpers import (
    device_rows,
    fill_device_random,
    page_indices,
    random_bits,
    same_bytes,
    snapshot,
)
from sgl_core.testing._suite_mha import MHAChecks
from sgl_core.testing._suite_rows import RowChecks
from sgl_core.testing._suite_values import ValueChecks

__all__ = ["BackendConformanceSuite"]


class BackendConformanceSuite(MHAChecks, RowChecks, ValueChecks):
    """Subclass with ``backend_name`` set; pytest collects the ``test_*`` methods.

    Hooks, class attributes and helpers: ``SuiteBase``; pool and L3 checks:
    ``PoolChecks``; bad calls and concurrency: ``MisuseChecks``; packed rows
    and the indexer cache: ``RowChecks``; rows of another dtype or shape,
    meta rows and integer layer ids: ``ValueChecks``; the transfer checks are here. MHA
    pools: ``MHAChecks`` (``test_mha_*``, every pair of
    ``supported_mha_pairs``; skipped where it is empty; hook
    ``make_mha_device_pool``, class attributes in ``MHASuiteBase``).
    """

    # ----------------------------------------------------------------- tests
    def test_supported_pairs_are_typed(self, backend: Backend) -> None:
        pairs = list(self.pairs(backend))
        assert pairs, "a backend must support at least one (layout, io backend) pair"
        for layout, io in pairs:
            assert isinstance(layout, HostLayout)
            assert isinstance(io, IOBackend)
        assert isinstance(backend.name, str)
        assert isinstance(backend.is_available(), bool)

    def test_default_io_is_a_supported_io_backend(self, backend: Backend) -> None:
        for layout, ios in backend.supported_pairs.items():
            chosen = backend.default_io(layout)
            assert chosen in ios, f"default_io({layout.value!r}) = {chosen!r} not in {set(ios)}"
            assert backend.default_io(layout.value) is chosen  # strings too, same answer

    def test_page_granularity_is_what_the_pool_says(self, backend: Backend) -> None:
        """A pair that takes partial pages moves them bit-exact; one that does not rejects them.

        (The rejection, with no byte changed, is in ``bad_calls``.)
        """
        ps = 16
        for layout, io in self.pairs(backend):
            src, host = self.build(backend, layout, ps, seed=11)
            whole = host.moves_whole_pages(io)
            assert isinstance(whole, bool)
            assert host.moves_whole_pages(io.value) is whole
            unsupported = [b for b in IOBackend if b not in backend.supported_pairs[layout]]
            if unsupported:
                with pytest.raises(UnsupportedLayoutError):
                    host.moves_whole_pages(unsupported[0])
            if whole:
                continue
            d_idx = torch.tensor([3, 17, 18, 40], dtype=torch.int64)
            h_idx = torch.tensor([70, 5, 6, 33], dtype=torch.int64)
            host.backup_from_device_all_layer(src, h_idx, d_idx, io)
            dst = self.make_device_pool(backend, page_size=ps, pages=self.device_pages)
            fill_device_random(dst, 12)
            for layer in range(self.layer_num):
                host.load_to_device_per_layer(dst, h_idx, d_idx, layer, io)
                assert torch.equal(device_rows(src, layer, d_idx), device_rows(dst, layer, d_idx))

    @pytest.mark.parametrize("page_size", [1, 16, 64])
    def test_round_trip_shuffled_pages(self, backend: Backend, page_size: int) -> None:
        if page_size not in self.page_sizes:
            pytest.skip(f"page_size {page_size} not used by this backend")
        gen = torch.Generator().manual_seed(page_size)
        total = self.device_pages + 1
        for layout, io in self.pairs(backend):
            dev_pages = torch.randperm(total, generator=gen)[:4].tolist()
            host_pages = sorted(torch.randperm(2 * self.device_pages, generator=gen)[:4].tolist())
            host_pages.reverse()
            self.round_trip(backend, layout, io, page_size, dev_pages, host_pages)

    def test_round_trip_contiguous_runs(self, backend: Backend) -> None:
        for layout, io in self.pairs(backend):
            self.round_trip(backend, layout, io, 16, [1, 2, 3, 5], [4, 5, 6, 0])

    @pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
    def test_fp8_round_trips(self, backend: Backend, fp8: str) -> None:
        """fp8 KV caches (DeepSeek deployments) move as bytes: bit-exact on every pair.

        Random bit patterns include fp8 NaNs, so only a byte copy passes.
        """
        dtype: torch.dtype = getattr(torch, fp8)
        # this test's pools only (pytest: one instance per test); dtype is a ClassVar to mypy
        setattr(self, "dtype", dtype)  # noqa: B010
        dev = self.make_device_pool(backend, page_size=16, pages=self.device_pages)
        assert dev.dtype == dtype
        gen = torch.Generator().manual_seed(11)
        loc = page_indices([2, 0, 5], 16)
        if self.kv_cache_dim is None:  # packed rows have no split accessors
            nope = random_bits((loc.numel(), 1, dev.kv_lora_rank), dtype, gen)
            rope = random_bits((loc.numel(), 1, dev.qk_rope_head_dim), dtype, gen)
            dev.set_mla_kv_buffer(1, loc, nope, rope)
            got_nope, got_rope = dev.get_mla_kv_buffer(1, loc)
            assert got_nope.dtype == got_rope.dtype == dtype
            assert torch.equal(got_nope.cpu().view(torch.uint8), nope.view(torch.uint8))
            assert torch.equal(got_rope.cpu().view(torch.uint8), rope.view(torch.uint8))
        for layout, io in self.pairs(backend):
            for page_size in (p for p in self.page_sizes if p <= 16):
                self.round_trip(backend, layout, io, page_size, [3, 1, 6], [0, 7, 2])
            src, host = self.build(backend, layout, 16, seed=12)
            host.backup_from_device_all_layer(src, page_indices([4], 16), page_indices([1], 16), io)
            page = host.get_data_page(4 * 16)
            host.set_from_flat_data_page(9 * 16, page)
            assert torch.equal(host.get_data_page(9 * 16).view(torch.uint8), page.view(torch.uint8))

    def test_empty_transfer_is_a_no_op(self, backend: Backend) -> None:
        empty = torch.empty(0, dtype=torch.int64)
        for layout, io in self.pairs(backend):
            dev, host = self.build(backend, layout, 16)
            before = snapshot(dev, host)
            host.backup_from_device_all_layer(dev, empty, empty, io)
            host.load_to_device_per_layer(dev, empty, empty, 0, io)
            assert same_bytes(before, snapshot(dev, host))

    def test_load_touches_only_that_layer(self, backend: Backend) -> None:
        for layout, io in self.pairs(backend):
            src, host = self.build(backend, layout, 16, seed=3)
            idx = page_indices([2, 4], 16)
            host.backup_from_device_all_layer(src, idx, idx, io)
            dst = self.make_device_pool(backend, page_size=16, pages=self.device_pages)
            fill_device_random(dst, 4)
            all_slots = torch.arange(dst.size + dst.page_size, dtype=torch.int64)
            before = [device_rows(dst, layer, all_slots) for layer in range(self.layer_num)]
            target = self.layer_num - 1
            host.load_to_device_per_layer(dst, idx, idx, target, io)
            for layer in range(self.layer_num):
                now = device_rows(dst, layer, all_slots)
                if layer != target:
                    assert torch.equal(now, before[layer]), f"{layout.value}: layer {layer} touched"
            assert torch.equal(device_rows(dst, target, idx), device_rows(src, target, idx))

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,
        ],
    )
    @given(data=st.data())
    def test_random_round_trips(self, backend: Backend, data: st.DataObject) -> None:
        pairs = list(self.pairs(backend))
        layout, io = data.draw(st.sampled_from(pairs), label="pair")
        page_size = data.draw(st.sampled_from([p for p in self.page_sizes if p <= 16]), label="ps")
        count = data.draw(st.integers(1, self.device_pages), label="pages")
        dev_pages = data.draw(
            st.permutations(range(self.device_pages + 1)).map(lambda p: list(p[:count]))
        )
        host_pages = data.draw(
            st.permutations(range(2 * self.device_pages)).map(lambda p: list(p[:count]))
        )
        self.round_trip(backend, layout, io, page_size, dev_pages, host_pages)
