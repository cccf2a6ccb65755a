"""MHA conformance checks of misuse, concurrency, construction and the L3 page helpers.

Every bad call raises a typed :mod:`sgl_core.errors` exception and leaves
every byte of both pools unchanged; per-layer loads re-validate changed
indices; a backup thread and a load thread may share one pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._kv_protocols import MHADevicePool, MHAHostPool
from sgl_core._protocols import Backend
from sgl_core.errors import PoolMismatchError, SGLError, UnsupportedLayoutError
from sgl_core.testing._helpers import page_indices, read_memory, same_bytes
from sgl_core.testing._mha_helpers import fill_mha_device_random, mha_device_rows, mha_snapshot
from sgl_core.testing._suite_mha_base import MHASuiteBase

__all__ = ["MHAMisuseChecks"]

Case = tuple[str, type[Exception], Callable[[], None]]


class MHAMisuseChecks(MHASuiteBase):
    """Rejected calls, re-validation, threads, construction and L3 pages of MHA pools."""

    def mha_bad_calls(
        self, backend: Backend, dev: MHADevicePool, host: MHAHostPool, io: IOBackend
    ) -> list[Case]:
        ps = host.page_size
        good_h = page_indices([1, 3], ps)
        good_d = page_indices([2, 4], ps)
        backup = host.backup_from_device_all_layer
        load = host.load_to_device_per_layer
        dup = torch.cat([good_h[:ps], good_h[:ps]])
        wrong_heads = backend.create_mha_device_pool(
            size=dev.size,
            page_size=ps,
            dtype=dev.dtype,
            head_num=dev.head_num + 1,
            head_dim=dev.head_dim,
            layer_num=dev.layer_num,
            v_head_dim=dev.v_head_dim,
        )
        wrong_v = backend.create_mha_device_pool(
            size=dev.size,
            page_size=ps,
            dtype=dev.dtype,
            head_num=dev.head_num,
            head_dim=dev.head_dim,
            layer_num=dev.layer_num,
            v_head_dim=dev.v_head_dim + 2,
        )
        mla = self.make_device_pool(backend, page_size=ps, pages=self.device_pages)
        cases: list[Case] = [
            ("int32 indices", TypeError, lambda: backup(dev, good_h.int(), good_d, io)),
            ("list indices", TypeError, lambda: backup(dev, good_h.tolist(), good_d, io)),  # type: ignore[arg-type]
            ("2-D indices", ValueError, lambda: backup(dev, good_h[None], good_d[None], io)),
            ("length mismatch", ValueError, lambda: backup(dev, good_h, good_d[:ps], io)),
            ("host out of range", IndexError, lambda: backup(dev, good_h + host.size, good_d, io)),
            ("negative host", IndexError, lambda: backup(dev, good_h - 2 * ps, good_d, io)),
            (
                "device out of range",
                IndexError,
                lambda: load(dev, good_h, good_d + dev.size + dev.page_size, 0, io),
            ),
            ("duplicate host dst", ValueError, lambda: backup(dev, dup, good_d, io)),
            (
                "duplicate device dst",
                ValueError,
                lambda: load(dev, good_h, torch.cat([good_d[:ps]] * 2), 0, io),
            ),
            ("layer -1", IndexError, lambda: load(dev, good_h, good_d, -1, io)),
            ("layer too big", IndexError, lambda: load(dev, good_h, good_d, self.layer_num, io)),
            ("layer True", TypeError, lambda: load(dev, good_h, good_d, True, io)),
            ("unknown io backend", ValueError, lambda: backup(dev, good_h, good_d, "warp_drive")),
            ("meta host", ValueError, lambda: backup(dev, good_h.to("meta"), good_d, io)),
            ("meta device", ValueError, lambda: load(dev, good_h, good_d.to("meta"), 0, io)),
            ("float indices", TypeError, lambda: load(dev, good_h.double(), good_d, 0, io)),
            ("other head_num", ValueError, lambda: backup(wrong_heads, good_h, good_d, io)),
            ("other v_head_dim", ValueError, lambda: load(wrong_v, good_h, good_d, 0, io)),
            ("an MLA pool", ValueError, lambda: backup(mla, good_h, good_d, io)),  # type: ignore[arg-type]
            ("an MLA pool, load", ValueError, lambda: load(mla, good_h, good_d, 0, io)),  # type: ignore[arg-type]
        ]
        unsupported = self.io_not_in(backend, host.layout)
        if unsupported:
            cases.append(
                ("unsupported io", ValueError, lambda: backup(dev, good_h, good_d, unsupported[0]))
            )
        if ps > 1 and host.moves_whole_pages(io):
            shifted = good_h + 1
            cases.append(("misaligned", ValueError, lambda: backup(dev, shifted, good_d, io)))
            part = good_d[: ps - 1]
            cases.append(
                ("partial page", ValueError, lambda: load(dev, good_h[: ps - 1], part, 0, io))
            )
        return cases

    def test_mha_bad_input_rejected_and_pools_unchanged(self, backend: Backend) -> None:
        for layout, io in self.mha_pairs(backend):
            for ps in (1, 16):
                dev, host = self.mha_build(backend, layout, ps, seed=5)
                idx = page_indices(list(range(self.device_pages)), ps)
                host.backup_from_device_all_layer(dev, idx, idx, io)
                fill_mha_device_random(dev, 6)
                for name, builtin, call in self.mha_bad_calls(backend, dev, host, io):
                    before = mha_snapshot(dev, host)
                    with pytest.raises(SGLError) as info:
                        call()
                        pytest.fail(f"MHA {layout.value}/{io.value} ps={ps}: {name} accepted")
                    assert isinstance(info.value, builtin), f"{name}: {info.value!r}"
                    if name.startswith("an MLA pool") or name.startswith("other"):
                        assert isinstance(info.value, PoolMismatchError), f"{name}: {info.value!r}"
                    assert same_bytes(before, mha_snapshot(dev, host)), f"{layout}: {name} mutated"

    def test_mha_repeated_load_revalidates_changed_indices(self, backend: Backend) -> None:
        for layout, io in self.mha_pairs(backend):
            dev, host = self.mha_build(backend, layout, 16, seed=8)
            h_idx, d_idx = page_indices([1, 2], 16), page_indices([3, 4], 16)
            host.backup_from_device_all_layer(dev, h_idx, d_idx, io)
            host.load_to_device_per_layer(dev, h_idx, d_idx, 0, io)
            before = mha_snapshot(dev, host)
            d_idx.numpy()[:16] += dev.size + dev.page_size  # behind torch's back
            with pytest.raises(IndexError):
                host.load_to_device_per_layer(dev, h_idx, d_idx, 1, io)
            assert same_bytes(before, mha_snapshot(dev, host))
            # new values at the same place: loaded from the new host slots
            d_idx.numpy()[:16] -= dev.size + dev.page_size
            h_idx.numpy()[:16] += 16 * 5  # host page 6
            host.load_to_device_per_layer(dev, h_idx, d_idx, 1, io)
            expected = host.get_data_page(6 * 16)
            assert torch.equal(
                host.get_data_page(int(h_idx[0])).view(torch.uint8), expected.view(torch.uint8)
            )

    @staticmethod
    def _mha_load_repeatedly(
        host: MHAHostPool,
        dev: MHADevicePool,
        indices: tuple[torch.Tensor, torch.Tensor],
        io: IOBackend,
        start: threading.Barrier,
        failures: list[BaseException],
    ) -> None:
        try:
            start.wait()
            for _ in range(16):
                for layer in range(dev.layer_num):
                    host.load_to_device_per_layer(dev, indices[0], indices[1], layer, io)
        except BaseException as exc:
            failures.append(exc)

    def test_mha_concurrent_backup_and_load(self, backend: Backend) -> None:
        if not self.concurrent_transfers:
            pytest.skip(f"{self.backend_name}: transfers are not thread-safe in this setup")
        for layout, io in self.mha_pairs(backend):
            dev, host = self.mha_build(backend, layout, 16, seed=9)
            load_h, load_d = page_indices([0, 1], 16), page_indices([5, 6], 16)
            host.backup_from_device_all_layer(dev, load_h, page_indices([1, 2], 16), io)
            back_h, back_d = page_indices([7, 9], 16), page_indices([3, 4], 16)
            failures: list[BaseException] = []
            start = threading.Barrier(2)
            thread = threading.Thread(
                target=self._mha_load_repeatedly,
                args=(host, dev, (load_h, load_d), io, start, failures),
            )
            thread.start()
            start.wait()
            for _ in range(16):
                host.backup_from_device_all_layer(dev, back_h, back_d, io)
            thread.join()
            assert not failures, failures
            other = self.make_mha_device_pool(backend, page_size=16, pages=self.device_pages)
            for layer in range(self.layer_num):
                for h_idx, d_idx in ((back_h, back_d), (load_h, load_d)):
                    host.load_to_device_per_layer(other, h_idx, d_idx, layer, io)
                    assert torch.equal(
                        mha_device_rows(other, layer, d_idx), mha_device_rows(dev, layer, d_idx)
                    )

    def test_mha_unsupported_layout_rejected_at_build(self, backend: Backend) -> None:
        pairs = list(self.mha_pairs(backend))
        dev = self.make_mha_device_pool(backend, page_size=16, pages=2)
        for layout in HostLayout:
            if layout not in backend.supported_mha_pairs:
                with pytest.raises(UnsupportedLayoutError, match="supported pairs"):
                    backend.create_host_pool(dev, layout=layout)
        with pytest.raises(UnsupportedLayoutError):
            backend.create_host_pool(dev, layout="no_such_layout")
        for layout, io in pairs:
            for bad in self.io_not_in(backend, layout):
                with pytest.raises(UnsupportedLayoutError, match="supported pairs"):
                    backend.create_host_pool(dev, layout=layout, io_backend=bad)
            pool = backend.create_host_pool(dev, layout=layout.value, io_backend=io.value)
            assert pool.layout is layout
            assert (pool.head_num, pool.head_dim, pool.v_head_dim) == (
                dev.head_num,
                dev.head_dim,
                dev.v_head_dim,
            )

    def test_mha_l3_page_helpers(self, backend: Backend) -> None:
        for layout, io in self.mha_pairs(backend):
            for v_dim in self.v_dims():
                dev, host = self.mha_build(backend, layout, 16, seed=7, v_head_dim=v_dim)
                host.backup_from_device_all_layer(
                    dev, page_indices([3, 1, 2], 16), page_indices([0, 1, 2], 16), io
                )
                page = host.get_data_page(16)
                k_bytes = 16 * self.layer_num * dev.head_num * dev.head_dim * page.element_size()
                v_bytes = k_bytes // dev.head_dim * dev.v_head_dim
                assert page.dim() == 1 and page.numel() * page.element_size() == k_bytes + v_bytes
                dummy = host.get_dummy_flat_data_page()
                assert dummy.shape == page.shape and dummy.dtype == page.dtype
                assert not bool(dummy.view(torch.uint8).any())
                host.set_from_flat_data_page(5 * 16, page)
                assert torch.equal(
                    host.get_data_page(5 * 16).view(torch.uint8), page.view(torch.uint8)
                )
                ptrs, sizes = host.get_page_buffer_meta(page_indices([1, 3], 16))
                per_page = len(ptrs) // 2
                assert len(ptrs) == len(sizes) == 2 * per_page > 0
                assert sum(sizes[: per_page // 2]) == k_bytes  # K objects, then V
                for k, start in enumerate((16, 48)):
                    span = slice(k * per_page, (k + 1) * per_page)
                    raw = b"".join(
                        read_memory(p, s) for p, s in zip(ptrs[span], sizes[span], strict=True)
                    )
                    flat = host.get_data_page(start).contiguous().view(torch.uint8)
                    assert raw == flat.numpy().tobytes()
                bases, totals, objects = host.get_contiguous_buf_infos()
                assert len(bases) == len(totals) == len(objects) > 0
                for p, s in zip(ptrs, sizes, strict=True):
                    assert any(
                        b <= p and p + s <= b + t for b, t in zip(bases, totals, strict=True)
                    )
                with pytest.raises(IndexError):
                    host.get_data_page(host.size)
                with pytest.raises(ValueError):
                    host.get_data_page(1)
                with pytest.raises(ValueError):
                    host.set_from_flat_data_page(0, page[:-1])
                with pytest.raises(ValueError):
                    host.get_page_buffer_meta([1, 2])
                # the page of a pool with other V rows is refused
                _, other = self.mha_build(
                    backend, layout, 16, v_head_dim=v_dim or self.head_dim // 2
                )
                if other.get_dummy_flat_data_page().numel() != page.numel():
                    with pytest.raises(ValueError):
                        other.set_from_flat_data_page(0, page)

    def test_mha_alloc_free_accounting(self, backend: Backend) -> None:
        layout, _ = next(iter(self.mha_pairs(backend)))
        _, host = self.mha_build(backend, layout, 16)
        total = host.size
        first = host.alloc(32)
        assert first is not None and host.available_size() == total - 32
        assert host.alloc(total) is None
        assert host.free(first) == 32 and host.available_size() == total
        with pytest.raises(SGLError):
            host.free(first)
        host.clear()
        assert host.available_size() == total
