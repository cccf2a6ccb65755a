"""Conformance checks of the values the row accessors write (a base of ``BackendConformanceSuite``).

The accessors take rows of the pool's dtype and nothing else (docs/design.md
section 7): another dtype, another shape or a meta tensor is a typed error
before any byte moves, never a silent conversion. ``layer_id`` is any integer
(``operator.index``: numpy integers, 0-d integer tensors), never a ``bool``.
Pools say what they are (``repr``), a host pool remembers the ``io_backend``
it was built with, and a mismatched device pool is named field by field.
Every check runs on every kind.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from sgl_core import Backend
from sgl_core.errors import ArgumentTypeError, DeviceError, PoolMismatchError, ShapeMismatchError
from sgl_core.testing._helpers import (
    device_rows,
    fill_device_random,
    page_indices,
    refused,
    row_parts,
    write_parts,
    write_random_rows,
)
from sgl_core.testing._kinds import DevicePool, HostPool, KindCase, Pair
from sgl_core.testing._suite_base import SuiteBase

__all__ = ["ValueChecks"]

PAGE = 16
_DTYPES = (
    torch.int64,
    torch.float64,
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.uint8,
    torch.int8,
)


class ValueChecks(SuiteBase):
    """Rows of another dtype or shape, meta rows and integer layer ids, on every accessor."""

    def kind_pool(self, backend: Backend, kind: KindCase, **options: Any) -> DevicePool:
        dev = self.make_pool(backend, kind, page_size=PAGE, pages=2, **options)
        fill_device_random(dev, 31)
        return dev

    def test_rows_of_another_dtype_or_shape_are_refused(
        self, backend: Backend, kind: KindCase
    ) -> None:
        """Each part a row writer takes (KV, K, V, indexer key, scale) is checked alone.

        Another dtype, fewer rows, narrower rows or fewer heads is a
        ``ShapeMismatchError``, a meta tensor a ``DeviceError``; no byte changes.
        """
        dev = self.kind_pool(backend, kind)
        loc = page_indices([1], PAGE)
        layer = self.layer_num - 1  # one with an indexer row in the indexer kinds
        parts = row_parts(dev, layer, loc)
        write_parts(dev, layer, loc, parts)  # the parts as read back are taken
        for i, part in enumerate(parts):
            bad = [part.to(dtype) for dtype in _DTYPES if dtype != part.dtype]
            bad += [part[1:], part[..., 1:], part.to("meta")]
            if part.dim() == 3 and part.shape[1] > 1:
                bad.append(part[:, 1:])
            for value in bad:
                error = DeviceError if value.is_meta else ShapeMismatchError
                values = [*parts[:i], value, *parts[i + 1 :]]
                refused(error, dev, write_parts, dev, layer, loc, values)

    def test_any_integer_is_a_layer_id(self, backend: Backend, kind: KindCase) -> None:
        dev = self.kind_pool(backend, kind)
        loc = page_indices([1], PAGE)
        gen = torch.Generator().manual_seed(34)
        layer: Any
        for layer in (np.int64(1), np.int32(2), torch.tensor(1)):
            written = write_random_rows(dev, layer, loc, gen)
            assert torch.equal(device_rows(dev, layer, loc), written), f"layer {layer!r}"
        parts = row_parts(dev, 1, loc)
        for bad in (True, np.bool_(True), torch.tensor(True), 1.0, "1"):
            refused(ArgumentTypeError, dev, write_parts, dev, bad, loc, parts)

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
        refused(ArgumentTypeError, dev, bare.backup_from_device_all_layer, dev, loc, loc)

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
