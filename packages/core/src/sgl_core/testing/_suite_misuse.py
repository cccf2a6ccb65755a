"""Conformance checks of misuse and concurrency: bad calls, stale indices, two threads.

What they check: docs/design.md, section 4.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

import pytest
import torch

from sgl_core import Backend, IOBackend
from sgl_core.errors import PageAlignmentError, PoolMismatchError, SGLError
from sgl_core.testing._helpers import (
    device_rows,
    fill_device_random,
    page_indices,
    same_bytes,
    snapshot,
)
from sgl_core.testing._kinds import KINDS, DevicePool, HostPool, KindCase, Pair
from sgl_core.testing._suite_pools import PoolChecks

__all__ = ["MisuseChecks"]

Case = tuple[str, type[Exception], Callable[[], None]]


class MisuseChecks(PoolChecks):
    """Checks of rejected calls, re-validation and concurrent transfers."""

    def bad_calls(
        self, backend: Backend, kind: KindCase, dev: DevicePool, host: HostPool, io: IOBackend
    ) -> list[Case]:
        ps = host.page_size
        good_h = page_indices([1, 3], ps)
        good_d = page_indices([2, 4], ps)
        backup = host.backup_from_device_all_layer
        load = host.load_to_device_per_layer
        dup = torch.cat([good_h[:ps], good_h[:ps]])
        cases: list[Case] = [
            ("int32 indices", TypeError, lambda: backup(dev, good_h.int(), good_d, io)),
            ("list indices", TypeError, lambda: backup(dev, good_h.tolist(), good_d, io)),
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
        ]
        # Device pools the host pool must refuse (PoolMismatchError): of the same
        # kind with one field changed, and of the other family (MLA for MHA and
        # back) where the backend builds both.
        pools = {
            name: self.make_pool(backend, kind, page_size=ps, **options)
            for name, options in kind.mismatches(dev).items()
        }
        other = next(k for k in self.kinds + KINDS if k.mha != kind.mha)
        if other.pairs(backend):
            pools[f"an {other.family.upper()} pool"] = self.make_pool(backend, other, page_size=ps)
        for name, pool in pools.items():
            cases.append((f"{name}, backup", ValueError, partial(backup, pool, good_h, good_d, io)))
            cases.append((f"{name}, load", ValueError, partial(load, pool, good_h, good_d, 0, io)))
        unsupported = [b for b in IOBackend if b not in kind.pairs(backend)[host.layout]]
        if unsupported:
            cases.append(
                ("unsupported io", ValueError, lambda: backup(dev, good_h, good_d, unsupported[0]))
            )
        if ps > 1 and host.moves_whole_pages(io):
            shifted = good_h + 1
            cases.append(("misaligned", ValueError, lambda: backup(dev, shifted, good_d, io)))
            part_h, part_d = good_h[: ps - 1], good_d[: ps - 1]
            cases.append(("partial page", ValueError, lambda: load(dev, part_h, part_d, 0, io)))
        return cases

    def test_bad_input_rejected_and_pools_unchanged(
        self, backend: Backend, kind: KindCase, pair: Pair
    ) -> None:
        layout, io = pair
        for ps in (1, 16):
            dev, host = self.build(backend, kind, layout, ps, seed=5)
            # Put known bytes in the host pool so "unchanged" means something.
            idx = page_indices(list(range(self.device_pages)), ps)
            host.backup_from_device_all_layer(dev, idx, idx, io)
            fill_device_random(dev, 6)
            for name, builtin, call in self.bad_calls(backend, kind, dev, host, io):
                what = f"{kind.name} {layout.value}/{io.value} ps={ps}: {name}"
                before = snapshot(dev, host)
                with pytest.raises(SGLError) as info:
                    call()
                    pytest.fail(f"{what} was accepted")
                assert isinstance(info.value, builtin), f"{what}: {info.value!r}"
                if name == "misaligned" and isinstance(info.value, PageAlignmentError):
                    assert "host_indices" in str(info.value)
                if name.endswith(("backup", "load")):  # the mismatched pools
                    assert isinstance(info.value, PoolMismatchError), f"{what}: {info.value!r}"
                assert same_bytes(before, snapshot(dev, host)), f"{what} mutated"

    def test_repeated_load_revalidates_changed_indices(
        self, backend: Backend, kind: KindCase, pair: Pair
    ) -> None:
        """Per-layer loads may skip re-validation only for identical index values."""
        layout, io = pair
        dev, host = self.build(backend, kind, layout, 16, seed=8)
        h_idx, d_idx = page_indices([1, 2], 16), page_indices([3, 4], 16)
        host.backup_from_device_all_layer(dev, h_idx, d_idx, io)
        host.load_to_device_per_layer(dev, h_idx, d_idx, 0, io)
        before = snapshot(dev, host)
        # Written behind torch's back (no version bump): must still be caught.
        d_idx.numpy()[:16] += dev.size + dev.page_size
        with pytest.raises(IndexError):
            host.load_to_device_per_layer(dev, h_idx, d_idx, 1, io)
        assert same_bytes(before, snapshot(dev, host))
        # New values in the same tensors: loaded from the new host slots.
        d_idx.numpy()[:16] -= dev.size + dev.page_size
        h_idx.numpy()[:16] += 16 * 5  # host page 6
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, io)
        other = self.make_pool(backend, kind)
        host.load_to_device_per_layer(other, h_idx.clone(), d_idx.clone(), 1, io)
        assert torch.equal(device_rows(dev, 1, d_idx), device_rows(other, 1, d_idx))

    def test_concurrent_backup_and_load(self, backend: Backend, kind: KindCase, pair: Pair) -> None:
        """A write-back thread and a load thread share a pool; neither sees the other's plan."""
        if not self.concurrent_transfers:
            pytest.skip(f"{self.backend_name}: transfers are not thread-safe in this setup")
        layout, io = pair
        dev, host = self.build(backend, kind, layout, 16, seed=9)
        load_h, load_d = page_indices([0, 1], 16), page_indices([5, 6], 16)
        host.backup_from_device_all_layer(dev, load_h, page_indices([1, 2], 16), io)
        back_h, back_d = page_indices([7, 9], 16), page_indices([3, 4], 16)
        failures: list[BaseException] = []
        start = threading.Barrier(2)

        def load_repeatedly() -> None:
            try:
                start.wait()
                for _ in range(24):
                    for layer in range(dev.layer_num):
                        host.load_to_device_per_layer(dev, load_h, load_d, layer, io)
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=load_repeatedly)
        thread.start()
        start.wait()
        for _ in range(24):
            host.backup_from_device_all_layer(dev, back_h, back_d, io)
        thread.join()
        assert not failures, failures
        other = self.make_pool(backend, kind)
        for layer in range(self.layer_num):
            for h_idx, d_idx in ((back_h, back_d), (load_h, load_d)):
                host.load_to_device_per_layer(other, h_idx, d_idx, layer, io)
                assert torch.equal(device_rows(other, layer, d_idx), device_rows(dev, layer, d_idx))
