"""Conformance checks of the row accessors: the values they take, packed rows, the indexer.

What the writers refuse: docs/design.md, element types. The packed-row and
indexer checks build their own pools with explicit ``kv_cache_dim`` / indexer
arguments, so every backend runs them whatever its ``kinds`` say; the round
trips and bad calls of such pools are the kind-parametrized checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from sgl_core import Backend, IndexerCache, KVRows
from sgl_core.errors import (
    ArgumentTypeError,
    DeviceError,
    LayerIndexError,
    PoolMismatchError,
    SGLError,
    ShapeMismatchError,
)
from sgl_core.testing._helpers import (
    device_rows,
    page_indices,
    random_bits,
    refused,
    row_parts,
    slot_count,
    write_parts,
    write_random_rows,
)
from sgl_core.testing._kinds import DSA_ROW_BYTES, KINDS, HostPool, KindCase, Pair
from sgl_core.testing._suite_misuse import MisuseChecks

__all__ = ["RowChecks"]

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


class RowChecks(MisuseChecks):
    """Values the row writers take or refuse, raw and packed rows, the indexer cache."""

    def test_raw_rows_round_trip_and_bad_rows(self, backend: Backend) -> None:
        """DeepSeek-V3.2-shaped packed rows (656 uint8 bytes): raw accessors only."""
        dsa: dict[str, Any] = {"dtype": torch.uint8, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
        dev = self.mla_pool(backend, seed=21, kv_cache_dim=DSA_ROW_BYTES, **dsa)
        assert isinstance(dev, KVRows) and dev.kv_cache_dim == DSA_ROW_BYTES
        gen = torch.Generator().manual_seed(3)
        loc = page_indices([4, 1], 16)[::3]
        rows = random_bits((loc.numel(), DSA_ROW_BYTES), torch.uint8, gen)
        dev.set_kv_rows(2, loc, rows)
        got = dev.get_kv_rows(2, loc)
        assert got.dtype == torch.uint8 and torch.equal(got.cpu(), rows)
        for value in (rows.float(), rows[:, :-8], rows.unsqueeze(1), rows[:-1]):
            refused(PoolMismatchError, dev, dev.set_kv_rows, 2, loc, value)
        refused(TypeError, dev, dev.set_kv_rows, 2, loc, rows.tolist())
        refused(IndexError, dev, dev.set_kv_rows, self.layer_num, loc, rows)
        refused(IndexError, dev, dev.get_kv_rows, 0, loc + slot_count(dev))
        loc = page_indices([1], 16)
        nope = torch.zeros((loc.numel(), 1, 512), dtype=torch.uint8)
        rope = torch.zeros((loc.numel(), 1, 64), dtype=torch.uint8)
        set_split = dev.set_mla_kv_buffer
        refused(PoolMismatchError, dev, set_split, 0, loc, nope, rope, match="set_kv_rows")
        refused(PoolMismatchError, dev, dev.get_mla_kv_buffer, 0, loc, match="get_kv_rows")
        # kv_cache_dim equal to the split is the plain row: split accessors work.
        plain = self.mla_pool(
            backend, seed=4, kv_cache_dim=self.kv_lora_rank + self.qk_rope_head_dim
        )
        assert isinstance(plain, KVRows)
        raw = plain.get_kv_rows(0, loc)  # device_rows: the split parts, concatenated
        assert torch.equal(device_rows(plain, 0, loc), raw.cpu().view(torch.uint8))
        fresh = random_bits(tuple(raw.shape), plain.dtype, torch.Generator().manual_seed(5))
        plain.set_kv_rows(0, loc, fresh)
        assert torch.equal(device_rows(plain, 0, loc), fresh.view(torch.uint8))
        with pytest.raises(SGLError):
            self.mla_pool(backend, kv_cache_dim=0)

    def test_dsa_rows_round_trip_every_pair(self, backend: Backend, pair: Pair) -> None:
        """DeepSeek-V3.2's rows with the indexer, bit-exact on every MLA pair."""
        dsa = next(k for k in KINDS if k.name == "dsa")
        options: dict[str, Any] = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
        self.round_trip(backend, dsa, pair, 16, [1, 6, 3], [5, 0, 2], **options)

    def test_indexer_rows_bad_input_changes_no_byte(self, backend: Backend) -> None:
        options: dict[str, Any] = {
            "index_head_dim": 8,
            "indexer_layer_ids": [1],
            "with_index_k_scale": True,
        }
        dev = self.mla_pool(backend, seed=10, **options)
        assert isinstance(dev, IndexerCache) and dev.indexer_layer_ids == (1,)
        loc = page_indices([2], 16)
        keys = torch.zeros((loc.numel(), 1, 8), dtype=self.dtype)
        scales = torch.ones((loc.numel(), 1, 1), dtype=torch.float32)
        set_keys = dev.set_index_k_buffer
        # (keys or scales of another dtype or shape: every kind's row-value check)
        refused(LayerIndexError, dev, set_keys, 0, loc, keys, scales)  # a layer without indexer
        refused(PoolMismatchError, dev, set_keys, 1, loc, keys)  # no scale
        refused(IndexError, dev, set_keys, 1, loc + 10**6, keys, scales)
        with pytest.raises(SGLError):
            self.mla_pool(backend, index_head_dim=8, indexer_layer_ids=[self.layer_num])
        with pytest.raises(SGLError):
            self.mla_pool(backend, indexer_layer_ids=[0])

    def test_rows_of_another_dtype_or_shape_are_refused(
        self, backend: Backend, kind: KindCase
    ) -> None:
        """Each part a row writer takes (KV, K, V, indexer key, scale) is checked alone.

        Another dtype, fewer rows, narrower rows or fewer heads is a
        ``ShapeMismatchError``, a meta tensor a ``DeviceError``; no byte changes.
        """
        dev = self.make_pool(backend, kind, pages=2, seed=31)
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
        dev = self.make_pool(backend, kind, pages=2, seed=31)
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
        dev = self.make_pool(backend, kind, pages=2, seed=31)
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
        dev = self.make_pool(backend, kind, pages=2, seed=31)
        host: HostPool = backend.create_host_pool(dev, layout=layout, io_backend=io)
        assert getattr(host, "default_io_backend", None) is io, f"{layout}/{io}"
        # No io: the pool's own (the protocols keep io_backend required, for
        # portability to other implementations; every shipped pool defaults it,
        # so the calls below go through an untyped ``HostPool``).
        host.backup_from_device_all_layer(dev, loc, loc)
        twin = self.make_pool(backend, kind, pages=2, seed=33)
        for layer in range(self.layer_num):  # an engine's numpy layer index is an int
            layer_id: Any = np.int64(layer)
            host.load_to_device_per_layer(twin, loc, loc, layer_id)
            assert torch.equal(device_rows(twin, layer, loc), device_rows(dev, layer, loc))
        bare: HostPool = backend.create_host_pool(dev, layout=layout)
        refused(ArgumentTypeError, dev, bare.backup_from_device_all_layer, dev, loc, loc)

    def test_mismatch_names_the_field(self, backend: Backend, kind: KindCase, pair: Pair) -> None:
        layout, io = pair
        dev = self.make_pool(backend, kind, pages=2, seed=31)
        other_dtype = torch.float16 if dev.dtype != torch.float16 else torch.bfloat16
        other = self.make_pool(backend, kind, pages=2, seed=31, dtype=other_dtype)
        loc = page_indices([1], PAGE)
        host: HostPool = backend.create_host_pool(dev, layout=layout)
        with pytest.raises(PoolMismatchError) as info:
            host.backup_from_device_all_layer(other, loc, loc, io)
        assert f"dtype is {other_dtype}, expected {dev.dtype}" in str(info.value)
        assert "layer_num" not in str(info.value), str(info.value)
