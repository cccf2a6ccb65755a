"""The backend conformance suite: one behaviour contract for every backend and KV kind.

What each check runs and checks: docs/design.md, section 4. Override
:meth:`make_device_pool` / :meth:`make_mha_device_pool` to pass
backend-specific options. Checks compare raw bytes read through the public API.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_core import Backend, IOBackend
from sgl_core.errors import UnsupportedLayoutError
from sgl_core.testing._helpers import (
    device_rows,
    page_indices,
    row_parts,
    same_bytes,
    snapshot,
    write_random_rows,
)
from sgl_core.testing._kinds import KindCase, Pair
from sgl_core.testing._suite_rows import RowChecks

__all__ = ["BackendConformanceSuite"]


class BackendConformanceSuite(RowChecks):
    """Subclass with ``backend_name`` set; pytest collects the ``test_*`` methods.

    Its bases, in order (hooks in ``SuiteBase``): docs/design.md, module map.
    """

    def test_backend_says_what_it_is(self, backend: Backend) -> None:
        assert backend.supported_pairs, "a backend must support at least one MLA pair"
        assert isinstance(backend.name, str)
        assert isinstance(backend.is_available(), bool)

    def test_page_granularity_is_what_the_pool_says(
        self, backend: Backend, kind: KindCase, pair: Pair
    ) -> None:
        """A pair that takes partial pages moves them bit-exact; one that does not rejects them.

        (The rejection, with no byte changed, is in ``bad_calls``.)
        """
        layout, io = pair
        _, host = self.build(backend, kind, layout, 16)
        whole = host.moves_whole_pages(io)
        assert isinstance(whole, bool)
        assert host.moves_whole_pages(io.value) is whole
        unsupported = [b for b in IOBackend if b not in kind.pairs(backend)[layout]]
        if unsupported:
            with pytest.raises(UnsupportedLayoutError):
                host.moves_whole_pages(unsupported[0])
        if not whole:
            self.round_trip(backend, kind, pair, 16, [3, 17, 18, 40], [70, 5, 6, 33], unit=1)

    @pytest.mark.parametrize("page_size", [1, 16, 64])
    def test_round_trip_shuffled_pages(
        self, backend: Backend, kind: KindCase, pair: Pair, page_size: int
    ) -> None:
        if page_size not in self.page_sizes:
            pytest.skip(f"page_size {page_size} not used by this backend")
        gen = torch.Generator().manual_seed(page_size)
        dev_pages = torch.randperm(self.device_pages + 1, generator=gen)[:4].tolist()
        host_pages = sorted(torch.randperm(2 * self.device_pages, generator=gen)[:4].tolist())
        host_pages.reverse()
        self.round_trip(backend, kind, pair, page_size, dev_pages, host_pages)

    def test_round_trip_contiguous_runs(self, backend: Backend, kind: KindCase, pair: Pair) -> None:
        self.round_trip(backend, kind, pair, 16, [1, 2, 3, 5], [4, 5, 6, 0])

    @pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
    def test_fp8_round_trips(self, backend: Backend, kind: KindCase, pair: Pair, fp8: str) -> None:
        """fp8 KV caches (DeepSeek deployments) move as bytes: bit-exact on every pair.

        Random bit patterns include fp8 NaNs, so only a byte copy passes.
        """
        dtype: torch.dtype = getattr(torch, fp8)
        dev = self.make_pool(backend, kind, dtype=dtype)
        assert dev.dtype == dtype
        loc = page_indices([2, 0, 5], 16)
        written = write_random_rows(dev, 1, loc, torch.Generator().manual_seed(11))
        assert torch.equal(device_rows(dev, 1, loc), written)
        parts = row_parts(dev, 1, loc)
        assert all(p.dtype in (dtype, torch.float32) for p in parts) and parts[0].dtype == dtype
        layout, io = pair
        for page_size in (p for p in self.page_sizes if p <= 16):
            self.round_trip(backend, kind, pair, page_size, [3, 1, 6], [0, 7, 2], dtype=dtype)
        src, host = self.build(backend, kind, layout, 16, seed=12, dtype=dtype)
        host.backup_from_device_all_layer(src, page_indices([4], 16), page_indices([1], 16), io)
        page = host.get_data_page(4 * 16)
        host.set_from_flat_data_page(9 * 16, page)
        assert torch.equal(host.get_data_page(9 * 16).view(torch.uint8), page.view(torch.uint8))

    def test_empty_transfer_is_a_no_op(self, backend: Backend, kind: KindCase, pair: Pair) -> None:
        layout, io = pair
        empty = torch.empty(0, dtype=torch.int64)
        dev, host = self.build(backend, kind, layout, 16)
        before = snapshot(dev, host)
        host.backup_from_device_all_layer(dev, empty, empty, io)
        host.load_to_device_per_layer(dev, empty, empty, 0, io)
        assert same_bytes(before, snapshot(dev, host))

    def test_load_touches_only_that_layer(
        self, backend: Backend, kind: KindCase, pair: Pair
    ) -> None:
        self.round_trip(backend, kind, pair, 16, [2, 4], [2, 4], layers=[self.layer_num - 1])

    @settings(
        max_examples=5,  # per kind and pair
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,
        ],
    )
    @given(data=st.data())
    def test_random_round_trips(
        self, backend: Backend, kind: KindCase, pair: Pair, data: st.DataObject
    ) -> None:
        page_size = data.draw(st.sampled_from([p for p in self.page_sizes if p <= 16]), label="ps")
        count = data.draw(st.integers(1, self.device_pages), label="pages")
        dev_pages = data.draw(
            st.permutations(range(self.device_pages + 1)).map(lambda p: list(p[:count]))
        )
        host_pages = data.draw(
            st.permutations(range(2 * self.device_pages)).map(lambda p: list(p[:count]))
        )
        self.round_trip(backend, kind, pair, page_size, dev_pages, host_pages)
