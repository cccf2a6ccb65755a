"""Conformance checks of the values the row accessors write (a base of ``BackendConformanceSuite``).

The accessors take rows of the pool's dtype and nothing else (docs/design.md
section 7): another dtype, another shape or a meta tensor is a typed error
before any byte moves, never a silent conversion. ``layer_id`` is any integer
(``operator.index``: numpy integers, 0-d integer tensors), never a ``bool``.
Pools say what they are (``repr``), a host pool remembers the ``io_backend``
it was built with, and a mismatched device pool is named field by field
(those three on every kind). The accessor checks build their own small
pools, so every backend runs them whatever its ``kinds`` say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from sgl_core import Backend, IndexerCache, KVRows, MLADevicePool
from sgl_core.errors import ArgumentTypeError, DeviceError, PoolMismatchError, ShapeMismatchError
from sgl_core.testing._helpers import device_rows, fill_device_random, page_indices, same_bytes
from sgl_core.testing._kinds import DevicePool, HostPool, KindCase, Pair
from sgl_core.testing._suite_base import SuiteBase

__all__ = ["ValueChecks"]

PAGE = 16


class ValueChecks(SuiteBase):
    """Rows of another dtype or shape, meta rows and integer layer ids, on every accessor."""

    def value_pool(self, backend: Backend, **options: Any) -> MLADevicePool:
        args = self.device_pool_args(**options)
        dev = backend.create_device_pool(size=2 * PAGE, page_size=PAGE, **args)
        fill_device_random(dev, 31)
        return dev

    def other_dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(d for d in (torch.int64, torch.float32, torch.float16) if d != self.dtype)

    @staticmethod
    def refused(
        error: type[Exception],
        read: Callable[[], list[torch.Tensor]],
        call: Callable[..., object],
        *args: object,
    ) -> None:
        """``call(*args)`` raises ``error`` and ``read()`` sees the same bytes after."""
        before = read()
        with pytest.raises(error):
            call(*args)
        assert same_bytes(before, read()), f"a refused call ({error.__name__}) changed the pool"

    @staticmethod
    def pool_bytes(dev: DevicePool) -> Callable[[], list[torch.Tensor]]:
        every = torch.arange(dev.size + dev.page_size, dtype=torch.int64)
        return lambda: [device_rows(dev, layer, every) for layer in range(dev.layer_num)]

    def test_split_rows_are_written_as_given_or_refused(self, backend: Backend) -> None:
        dev = self.value_pool(backend)
        loc = page_indices([1], PAGE)
        n, device = loc.numel(), dev.device
        nope = torch.zeros((n, 1, self.kv_lora_rank), dtype=self.dtype, device=device)
        rope = torch.zeros((n, 1, self.qk_rope_head_dim), dtype=self.dtype, device=device)
        read = self.pool_bytes(dev)
        for dtype in self.other_dtypes():
            self.refused(
                ShapeMismatchError, read, dev.set_mla_kv_buffer, 1, loc, nope.to(dtype), rope
            )
            self.refused(
                ShapeMismatchError, read, dev.set_mla_kv_buffer, 1, loc, nope, rope.to(dtype)
            )
        self.refused(ShapeMismatchError, read, dev.set_mla_kv_buffer, 1, loc, nope[1:], rope)
        self.refused(ShapeMismatchError, read, dev.set_mla_kv_buffer, 1, loc, nope, rope[..., 1:])
        self.refused(DeviceError, read, dev.set_mla_kv_buffer, 1, loc, nope.to("meta"), rope)
        self.refused(DeviceError, read, dev.set_mla_kv_buffer, 1, loc, nope, rope.to("meta"))

    def test_raw_rows_of_another_dtype_are_refused(self, backend: Backend) -> None:
        dim = self.kv_lora_rank + self.qk_rope_head_dim
        dev = self.value_pool(backend, dtype=torch.uint8, kv_cache_dim=dim)
        loc = page_indices([1], PAGE)
        rows = torch.zeros((loc.numel(), dim), dtype=torch.uint8, device=dev.device)
        read = self.pool_bytes(dev)
        assert isinstance(dev, KVRows)
        set_rows = dev.set_kv_rows
        for dtype in (torch.int64, torch.float32, torch.int8):
            self.refused(ShapeMismatchError, read, set_rows, 1, loc, rows.to(dtype))
        self.refused(ShapeMismatchError, read, set_rows, 1, loc, rows[:, 1:])
        self.refused(DeviceError, read, set_rows, 1, loc, rows.to("meta"))

    def test_indexer_rows_of_another_dtype_are_refused(self, backend: Backend) -> None:
        dev = self.value_pool(
            backend, index_head_dim=8, indexer_layer_ids=[0, 2], with_index_k_scale=True
        )
        loc = page_indices([1], PAGE)
        n, device = loc.numel(), dev.device
        keys = torch.zeros((n, 1, 8), dtype=self.dtype, device=device)
        scales = torch.ones((n, 1, 1), dtype=torch.float32, device=device)
        read = self.pool_bytes(dev)
        assert isinstance(dev, IndexerCache)
        set_keys = dev.set_index_k_buffer
        for dtype in self.other_dtypes():
            self.refused(ShapeMismatchError, read, set_keys, 2, loc, keys.to(dtype), scales)
        for dtype in (torch.bfloat16, torch.float64):
            self.refused(ShapeMismatchError, read, set_keys, 2, loc, keys, scales.to(dtype))
        self.refused(DeviceError, read, set_keys, 2, loc, keys.to("meta"), scales)
        self.refused(DeviceError, read, set_keys, 2, loc, keys, scales.to("meta"))

    def test_mha_rows_of_another_dtype_are_refused(self, backend: Backend) -> None:
        if not backend.supported_mha_pairs:
            pytest.skip(f"backend {backend.name!r} builds no MHA pools")
        dev = self.make_mha_device_pool(backend, page_size=PAGE, pages=2)
        fill_device_random(dev, 32)
        loc = page_indices([1], PAGE)
        n, device = loc.numel(), dev.device
        k = torch.zeros((n, dev.head_num, dev.head_dim), dtype=self.dtype, device=device)
        v = torch.zeros((n, dev.head_num, dev.v_head_dim), dtype=self.dtype, device=device)
        read = self.pool_bytes(dev)
        for dtype in self.other_dtypes():
            self.refused(ShapeMismatchError, read, dev.set_kv_buffer, 1, loc, k.to(dtype), v)
            self.refused(ShapeMismatchError, read, dev.set_kv_buffer, 1, loc, k, v.to(dtype))
        self.refused(ShapeMismatchError, read, dev.set_kv_buffer, 1, loc, k, v[:, :1])
        self.refused(DeviceError, read, dev.set_kv_buffer, 1, loc, k.to("meta"), v)
        self.refused(DeviceError, read, dev.set_kv_buffer, 1, loc, k, v.to("meta"))

    def test_any_integer_is_a_layer_id(self, backend: Backend) -> None:
        dev = self.value_pool(backend)
        loc = page_indices([1], PAGE)
        n, device = loc.numel(), dev.device
        ones = torch.ones((n, 1, self.kv_lora_rank), dtype=self.dtype, device=device)
        twos = torch.full((n, 1, self.qk_rope_head_dim), 2, dtype=self.dtype, device=device)
        for layer in (np.int64(1), np.int32(2), torch.tensor(1)):
            dev.set_mla_kv_buffer(layer, loc, ones, twos)  # type: ignore[arg-type]
            nope, rope = dev.get_mla_kv_buffer(layer, loc)  # type: ignore[arg-type]
            assert torch.equal(nope.cpu(), ones.cpu()) and torch.equal(rope.cpu(), twos.cpu())
        read = self.pool_bytes(dev)
        for bad in (True, np.bool_(True), torch.tensor(True), 1.0, "1"):
            self.refused(ArgumentTypeError, read, dev.set_mla_kv_buffer, bad, loc, ones, twos)

    def kind_pool(self, backend: Backend, kind: KindCase, **options: Any) -> DevicePool:
        dev = self.make_pool(backend, kind, page_size=PAGE, pages=2, **options)
        fill_device_random(dev, 31)
        return dev

    def test_pools_say_what_they_are(self, backend: Backend, kind: KindCase) -> None:
        dev = self.kind_pool(backend, kind)
        text = repr(dev)
        name, family = type(dev).__name__, kind.family
        assert text.startswith(f"{name}(kind={family}, size={dev.size}, "), text
        assert f"dtype={dev.dtype}" in text and f"device={dev.device}" in text, text
        for layout in kind.pairs(backend):
            host = backend.create_host_pool(dev, layout=layout)
            text = repr(host)
            assert text.startswith(f"{type(host).__name__}(kind={family}, layout={layout.value}, ")
            assert f"page_size={dev.page_size}" in text and f"dtype={dev.dtype}" in text, text

    def test_host_pool_remembers_its_io_backend(
        self, backend: Backend, kind: KindCase, pair: Pair
    ) -> None:
        """``create_host_pool(..., io_backend=io)`` is the default of its transfers."""
        loc = page_indices([1], PAGE)
        layout, io = pair
        dev = self.kind_pool(backend, kind)
        host: HostPool = backend.create_host_pool(dev, layout=layout, io_backend=io)
        assert getattr(host, "default_io_backend", None) is io, f"{layout}/{io}"
        # No io: the pool's own (the protocols keep io_backend required, for
        # portability to other implementations; every shipped pool defaults it,
        # so the calls below go through an untyped ``HostPool``).
        host.backup_from_device_all_layer(dev, loc, loc)
        twin = self.kind_pool(backend, kind)
        fill_device_random(twin, 33)
        for layer in range(self.layer_num):  # an engine's numpy layer index is an int
            layer_id: Any = np.int64(layer)
            host.load_to_device_per_layer(twin, loc, loc, layer_id)
            assert torch.equal(device_rows(twin, layer, loc), device_rows(dev, layer, loc))
        bare: HostPool = backend.create_host_pool(dev, layout=layout)
        read = self.pool_bytes(dev)
        self.refused(ArgumentTypeError, read, bare.backup_from_device_all_layer, dev, loc, loc)

    def test_mismatch_names_the_field(self, backend: Backend, kind: KindCase, pair: Pair) -> None:
        layout, io = pair
        dev = self.kind_pool(backend, kind)
        other_dtype = torch.float16 if dev.dtype != torch.float16 else torch.bfloat16
        other = self.kind_pool(backend, kind, dtype=other_dtype)
        loc = page_indices([1], PAGE)
        host: HostPool = backend.create_host_pool(dev, layout=layout)
        with pytest.raises(PoolMismatchError) as info:
            host.backup_from_device_all_layer(other, loc, loc, io)
        assert f"dtype is {other_dtype}, expected {dev.dtype}" in str(info.value)
        assert "layer_num" not in str(info.value), str(info.value)
