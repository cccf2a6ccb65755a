"""Conformance checks of packed rows (``kv_cache_dim``) and the indexer cache.

These build their own pools with explicit ``kv_cache_dim`` / indexer
arguments, so every backend runs them whatever its ``kinds`` say; the
round trips and bad calls of such pools are the kind-parametrized checks
(``KINDS``: ``mla_packed``, ``mla_indexer``, ``dsa``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from sgl_core import Backend, IndexerCache, KVRows, MLADevicePool
from sgl_core.errors import LayerIndexError, PoolMismatchError, SGLError
from sgl_core.l3 import page_format
from sgl_core.testing._helpers import (
    device_rows,
    fill_device_random,
    page_indices,
    random_bits,
    same_bytes,
    slot_count,
    snapshot,
)
from sgl_core.testing._kinds import DSA_ROW_BYTES, Pair
from sgl_core.testing._suite_misuse import MisuseChecks

__all__ = ["RowChecks"]


class RowChecks(MisuseChecks):
    """Raw-row accessors, packed rows, indexer configuration and page identity."""

    def pool(self, backend: Backend, **options: Any) -> MLADevicePool:
        args = self.device_pool_args(**options)
        return backend.create_device_pool(size=self.device_pages * 16, page_size=16, **args)

    def dsa_pool(self, backend: Backend, **options: Any) -> MLADevicePool:
        """A DeepSeek-V3.2-shaped pool: 656-byte uint8 rows, fp8-byte keys, fp32 scales."""
        dev = backend.create_device_pool(
            size=self.device_pages * 16,
            page_size=16,
            dtype=torch.uint8,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            layer_num=self.layer_num,
            kv_cache_dim=DSA_ROW_BYTES,
            **options,
        )
        fill_device_random(dev, 21)
        return dev

    def test_raw_rows_round_trip_and_bad_rows(self, backend: Backend) -> None:
        dev = self.dsa_pool(backend)
        assert isinstance(dev, KVRows) and dev.kv_cache_dim == DSA_ROW_BYTES
        gen = torch.Generator().manual_seed(3)
        loc = page_indices([4, 1], 16)[::3]
        rows = random_bits((loc.numel(), DSA_ROW_BYTES), torch.uint8, gen)
        dev.set_kv_rows(2, loc, rows)
        got = dev.get_kv_rows(2, loc)
        assert got.dtype == torch.uint8 and torch.equal(got.cpu(), rows)
        bad: list[tuple[str, object, type[Exception]]] = [
            ("float32 rows", rows.float(), PoolMismatchError),
            ("short rows", rows[:, :-8], PoolMismatchError),
            ("3-D rows", rows.unsqueeze(1), PoolMismatchError),
            ("too few rows", rows[:-1], PoolMismatchError),
            ("a list", rows.tolist(), TypeError),
        ]
        before = [device_rows(dev, layer, _all(dev)) for layer in range(self.layer_num)]
        for name, value, error in bad:
            with pytest.raises(error):
                dev.set_kv_rows(2, loc, value)  # type: ignore[arg-type]
                pytest.fail(f"{name} was accepted")
            now = [device_rows(dev, layer, _all(dev)) for layer in range(self.layer_num)]
            assert same_bytes(before, now), f"{name} changed the pool"
        with pytest.raises(IndexError):
            dev.set_kv_rows(self.layer_num, loc, rows)
        with pytest.raises(IndexError):
            dev.get_kv_rows(0, loc + slot_count(dev))

    def test_packed_rows_have_no_split_accessors(self, backend: Backend) -> None:
        dev = self.dsa_pool(backend)
        loc = page_indices([1], 16)
        before = device_rows(dev, 0, _all(dev))
        nope = torch.zeros((loc.numel(), 1, 512), dtype=torch.uint8)
        rope = torch.zeros((loc.numel(), 1, 64), dtype=torch.uint8)
        with pytest.raises(PoolMismatchError, match="set_kv_rows"):
            dev.set_mla_kv_buffer(0, loc, nope, rope)
        with pytest.raises(PoolMismatchError, match="get_kv_rows"):
            dev.get_mla_kv_buffer(0, loc)
        assert torch.equal(before, device_rows(dev, 0, _all(dev)))
        # kv_cache_dim equal to the split is the plain row: split accessors work.
        plain = self.pool(backend, kv_cache_dim=self.kv_lora_rank + self.qk_rope_head_dim)
        fill_device_random(plain, 4)
        nope, rope = plain.get_mla_kv_buffer(0, loc)
        assert isinstance(plain, KVRows)
        raw = plain.get_kv_rows(0, loc)
        assert torch.equal(
            torch.cat([nope, rope], -1)[:, 0].view(torch.uint8), raw.view(torch.uint8)
        )
        fresh = random_bits(tuple(raw.shape), plain.dtype, torch.Generator().manual_seed(5))
        plain.set_kv_rows(0, loc, fresh)  # raw rows are the split parts, concatenated
        nope, rope = plain.get_mla_kv_buffer(0, loc)
        got = torch.cat([nope, rope], -1)[:, 0].cpu().view(torch.uint8)
        assert torch.equal(got, fresh.view(torch.uint8))
        with pytest.raises(SGLError):
            self.pool(backend, kv_cache_dim=0)

    def test_dsa_rows_round_trip_every_pair(self, backend: Backend, pair: Pair) -> None:
        """656-byte uint8 rows plus fp8-byte keys and fp32 scales, bit-exact, per layer."""
        options = {"index_head_dim": 16, "indexer_layer_ids": [0, 2], "with_index_k_scale": True}
        src = self.dsa_pool(backend, **options)
        layout, io = pair
        host = backend.create_host_pool(src, layout=layout)
        dst = self.dsa_pool(backend, **options)
        fill_device_random(dst, 22)
        h_idx, d_idx = page_indices([5, 0, 2], 16), page_indices([1, 6, 3], 16)
        host.backup_from_device_all_layer(src, h_idx, d_idx, io)
        untouched = torch.ones(slot_count(dst), dtype=torch.bool)
        untouched[d_idx] = False
        for layer in range(self.layer_num):
            others = [device_rows(dst, x, _all(dst)) for x in range(self.layer_num)]
            host.load_to_device_per_layer(dst, h_idx, d_idx, layer, io)
            got = device_rows(dst, layer, d_idx)
            assert torch.equal(got, device_rows(src, layer, d_idx)), f"{layout}/{io} {layer}"
            now = device_rows(dst, layer, _all(dst))
            assert torch.equal(now[untouched], others[layer][untouched])
            for x in range(self.layer_num):  # other layers and their indexer slots
                if x != layer:
                    assert torch.equal(device_rows(dst, x, _all(dst)), others[x])

    def test_indexer_mismatch_changes_no_byte(self, backend: Backend, pair: Pair) -> None:
        base = {"index_head_dim": 8, "indexer_layer_ids": [0, 2], "with_index_k_scale": True}
        layout, io = pair
        dev = self.pool(backend, **base)
        fill_device_random(dev, 8)
        host = backend.create_host_pool(dev, layout=layout)
        idx = page_indices([0, 1], 16)
        host.backup_from_device_all_layer(dev, idx, idx, io)
        for change in (
            {"indexer_layer_ids": [0, 1]},
            {"with_index_k_scale": False},
            {"index_head_dim": 16},
            {"index_head_dim": None, "indexer_layer_ids": None, "with_index_k_scale": False},
        ):
            other = self.pool(backend, **{**base, **change})
            fill_device_random(other, 9)
            before = snapshot(other, host)
            with pytest.raises(PoolMismatchError):
                host.load_to_device_per_layer(other, idx, idx, 0, io)
            with pytest.raises(PoolMismatchError):
                host.backup_from_device_all_layer(other, idx, idx, io)
            assert same_bytes(before, snapshot(other, host)), f"{layout}/{io} {change}"

    def test_indexer_rows_bad_input_changes_no_byte(self, backend: Backend) -> None:
        dev = self.pool(backend, index_head_dim=8, indexer_layer_ids=[1], with_index_k_scale=True)
        assert isinstance(dev, IndexerCache) and dev.indexer_layer_ids == (1,)
        fill_device_random(dev, 10)
        loc = page_indices([2], 16)
        n = loc.numel()
        keys = torch.zeros((n, 1, 8), dtype=self.dtype)
        scales = torch.ones((n, 1, 1), dtype=torch.float32)
        before = snapshot_device(dev)
        set_keys = dev.set_index_k_buffer
        cases: list[tuple[str, Callable[[], None], type[Exception]]] = [
            ("layer without indexer", lambda: set_keys(0, loc, keys, scales), LayerIndexError),
            ("missing scale", lambda: set_keys(1, loc, keys), PoolMismatchError),
            (
                "wide keys",
                lambda: set_keys(1, loc, keys.repeat(1, 1, 2), scales),
                PoolMismatchError,
            ),
            ("short scales", lambda: set_keys(1, loc, keys, scales[1:]), PoolMismatchError),
            ("bad loc", lambda: set_keys(1, loc + 10**6, keys, scales), IndexError),
        ]
        for name, call, error in cases:
            with pytest.raises(error):
                call()
                pytest.fail(f"{name} was accepted")
            assert same_bytes(before, snapshot_device(dev)), f"{name} changed the pool"
        with pytest.raises(SGLError):
            self.pool(backend, index_head_dim=8, indexer_layer_ids=[self.layer_num])
        with pytest.raises(SGLError):
            self.pool(backend, indexer_layer_ids=[0])

    def test_indexer_is_part_of_the_page_format(self, backend: Backend) -> None:
        """Pools that differ only in the indexer never share a page identity."""
        configs: list[dict[str, Any]] = [
            {},
            {"index_head_dim": 8},
            {"index_head_dim": 8, "with_index_k_scale": True},
            {"index_head_dim": 8, "indexer_layer_ids": [1]},
            {"index_head_dim": 16},
            {"kv_cache_dim": 40, "dtype": torch.uint8},
            {"kv_cache_dim": 48, "dtype": torch.uint8},
        ]
        for layout in backend.supported_pairs:
            formats = [
                page_format(backend.create_host_pool(self.pool(backend, **dict(c)), layout=layout))
                for c in configs
            ]
            prints = [f.fingerprint for f in formats]
            assert len(set(prints)) == len(prints), f"{layout}: {[f.describe() for f in formats]}"


def _all(dev: MLADevicePool) -> torch.Tensor:
    return torch.arange(slot_count(dev), dtype=torch.int64)


def snapshot_device(dev: MLADevicePool) -> list[torch.Tensor]:
    return [device_rows(dev, layer, _all(dev)) for layer in range(dev.layer_num)]
