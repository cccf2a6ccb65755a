"""Conformance checks of pool construction, accounting and the L3 page helpers."""

from __future__ import annotations

import threading

import pytest
import torch

from sgl_core import Backend, HostLayout, IOBackend
from sgl_core.errors import (
    DeviceError,
    FreeError,
    PoolSizeError,
    SGLError,
    UnsupportedLayoutError,
)
from sgl_core.l3 import page_format
from sgl_core.testing._helpers import device_rows, page_indices, read_memory, row_parts
from sgl_core.testing._kinds import KindCase, Pair
from sgl_core.testing._suite_base import SuiteBase

__all__ = ["PoolChecks"]


class PoolChecks(SuiteBase):
    """Checks that need no transfer in flight: arguments, accounting, L3 pages."""

    def test_bad_pool_arguments_are_typed_errors(self, backend: Backend, kind: KindCase) -> None:
        """Sizing and device arguments: ``sgl_core.errors``, before anything is allocated."""
        dev = self.make_pool(backend, kind, pages=2)
        layout = next(iter(kind.pairs(backend)))
        for name, value, builtin in (
            ("host_to_device_ratio", float("nan"), ValueError),
            ("host_to_device_ratio", float("inf"), ValueError),
            ("host_to_device_ratio", "2", TypeError),
            ("host_size_gb", None, TypeError),
            ("host_size_gb", float("nan"), ValueError),
            ("host_size_gb", 1e9, ValueError),  # an exabyte: beyond memory
        ):
            with pytest.raises(SGLError) as info:
                backend.create_host_pool(dev, layout=layout, **{name: value})  # type: ignore[arg-type]
            assert isinstance(info.value, builtin), f"{name}={value!r}: {info.value!r}"
        for device in ("bogus", 0, "meta"):
            with pytest.raises(DeviceError):
                self.make_pool(backend, kind, pages=1, device=device)
        with pytest.raises(PoolSizeError):  # petabytes
            self.make_pool(backend, kind, pages=2**40)

    def test_pairs_are_typed_and_the_rest_rejected(self, backend: Backend, kind: KindCase) -> None:
        """Typed pairs with a default io backend; a pair not declared is refused at build."""
        dev = self.make_pool(backend, kind, pages=2)
        pairs = kind.pairs(backend)
        for layout in HostLayout:
            if layout not in pairs:
                with pytest.raises(UnsupportedLayoutError):
                    kind.default_io(backend, layout)
                with pytest.raises(UnsupportedLayoutError, match="supported pairs"):
                    backend.create_host_pool(dev, layout=layout)
        with pytest.raises(UnsupportedLayoutError):
            backend.create_host_pool(dev, layout="no_such_layout")
        for layout, ios in pairs.items():
            assert isinstance(layout, HostLayout) and ios
            assert all(isinstance(io, IOBackend) for io in ios)
            chosen = kind.default_io(backend, layout)
            assert chosen in ios, f"default io of {layout.value!r}: {chosen!r} not in {set(ios)}"
            assert kind.default_io(backend, layout.value) is chosen  # strings too, same answer
            for io in IOBackend:
                if io not in ios:
                    with pytest.raises(UnsupportedLayoutError, match="supported pairs"):
                        backend.create_host_pool(dev, layout=layout, io_backend=io)
            # The engine's plain strings are accepted.
            pool = backend.create_host_pool(
                dev, layout=layout.value, io_backend=next(iter(ios)).value
            )
            assert pool.layout is layout
            for name in ("page_size", "layer_num", "dtype", *kind.geometry):
                assert getattr(pool, name) == getattr(dev, name), f"{layout.value}: {name}"

    def test_l3_page_helpers(self, backend: Backend, kind: KindCase, pair: Pair) -> None:
        layout, io = pair
        dev, host = self.build(backend, kind, layout, 16, seed=7)
        idx = page_indices([0, 1, 2], 16)
        host.backup_from_device_all_layer(dev, page_indices([3, 1, 2], 16), idx, io)
        page = host.get_data_page(16)
        assert page.dim() == 1
        # A page holds its tokens' rows of every layer, every part, and nothing else.
        rows = [device_rows(dev, layer, idx[:16]) for layer in range(self.layer_num)]
        assert page.numel() * page.element_size() == sum(r.numel() for r in rows)
        dummy = host.get_dummy_flat_data_page()
        assert dummy.shape == page.shape and dummy.dtype == page.dtype
        assert not bool(dummy.view(torch.uint8).any())
        host.set_from_flat_data_page(5 * 16, page)
        assert torch.equal(host.get_data_page(5 * 16).view(torch.uint8), page.view(torch.uint8))
        ptrs, sizes = host.get_page_buffer_meta(page_indices([1, 3], 16))
        per_page = len(ptrs) // 2
        assert len(ptrs) == len(sizes) == 2 * per_page > 0
        if kind.mha:  # K objects, then V
            k_bytes = self.layer_num * row_parts(dev, 0, idx[:16])[0].numel() * page.element_size()
            assert sum(sizes[: per_page // 2]) == k_bytes
        for k, start in enumerate((16, 48)):
            span = slice(k * per_page, (k + 1) * per_page)
            raw = b"".join(read_memory(p, s) for p, s in zip(ptrs[span], sizes[span], strict=True))
            assert raw == host.get_data_page(start).contiguous().view(torch.uint8).numpy().tobytes()
        bases, totals, objects = host.get_contiguous_buf_infos()
        assert len(bases) == len(totals) == len(objects) > 0
        for p, s in zip(ptrs, sizes, strict=True):
            assert any(b <= p and p + s <= b + t for b, t in zip(bases, totals, strict=True))
        with pytest.raises(IndexError):
            host.get_data_page(host.size)
        with pytest.raises(ValueError):
            host.get_data_page(1)
        with pytest.raises(ValueError):
            host.set_from_flat_data_page(0, page[:-1])
        with pytest.raises(ValueError):
            host.get_page_buffer_meta([1, 2])
        # A pool with other rows has another page identity, and refuses the page.
        for name, options in kind.mismatches(dev).items():
            _, other = self.build(backend, kind, layout, 16, **options)
            assert page_format(other).fingerprint != page_format(host).fingerprint, name
            if other.get_dummy_flat_data_page().numel() != page.numel():
                with pytest.raises(ValueError):
                    other.set_from_flat_data_page(0, page)
                    pytest.fail(f"{name}: a page of another pool was accepted")

    def test_alloc_free_accounting(self, backend: Backend, kind: KindCase) -> None:
        layout = next(iter(kind.pairs(backend)))
        _, host = self.build(backend, kind, layout, 16)
        total = host.size
        assert host.available_size() == total
        first = host.alloc(32)
        assert first is not None and first.numel() == 32
        assert host.available_size() == total - 32
        assert host.alloc(total) is None
        with pytest.raises(ValueError):
            host.alloc(5)
        assert host.free(first) == 32
        with pytest.raises(FreeError):
            host.free(first)
        with pytest.raises(FreeError):
            host.free(torch.tensor([total], dtype=torch.int64))
        assert host.available_size() == total
        pages = host.alloc(32)
        assert pages is not None
        # Handing back part of a page would misalign later allocations.
        with pytest.raises(FreeError):
            host.free(pages[1:17])
        assert host.free(pages) == 32
        taken = host.alloc(total)
        assert taken is not None and torch.unique(taken).numel() == total
        host.clear()
        assert host.available_size() == total

    def test_alloc_free_threads(self, backend: Backend, kind: KindCase) -> None:
        layout = next(iter(kind.pairs(backend)))
        _, host = self.build(backend, kind, layout, 16)
        owners: dict[int, int] = {}
        owners_lock = threading.Lock()
        errors: list[str] = []

        def worker(me: int) -> None:
            for _ in range(50):
                got = host.alloc(16)
                if got is None:
                    continue
                with owners_lock:
                    for slot in got.tolist():
                        if slot in owners:
                            errors.append(f"slot {slot} handed out twice")
                        owners[slot] = me
                with owners_lock:
                    for slot in got.tolist():
                        del owners[slot]
                host.free(got)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert host.available_size() == host.size
