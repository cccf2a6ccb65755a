"""Conformance checks of packed rows (``kv_cache_dim``) and the indexer cache.

These build their own pools with explicit ``kv_cache_dim`` / indexer
arguments, so every backend runs them whatever its ``kinds`` say; the
round trips and bad calls of such pools are the kind-parametrized checks
(``KINDS``: ``mla_packed``, ``mla_indexer``, ``dsa``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sgl_core import Backend, IndexerCache, KVRows, MLADevicePool
from sgl_core.errors import LayerIndexError, PoolMismatchError, SGLError
from sgl_core.l3 import page_format
from sgl_core.testing._helpers import (
    device_bytes,
    page_indices,
    random_bits,
    refused,
    same_bytes,
    slot_count,
)
from sgl_core.testing._kinds import DSA_ROW_BYTES, KINDS, Pair
from sgl_core.testing._suite_misuse import MisuseChecks

__all__ = ["RowChecks"]


class RowChecks(MisuseChecks):
    """Raw-row accessors, packed rows, indexer configuration and page identity."""

    def dsa_pool(self, backend: Backend, **options: Any) -> MLADevicePool:
        """A DeepSeek-V3.2-shaped pool: 656-byte uint8 rows, fp8-byte keys, fp32 scales."""
        dsa: dict[str, Any] = {"dtype": torch.uint8, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
        return self.mla_pool(backend, seed=21, kv_cache_dim=DSA_ROW_BYTES, **dsa, **options)

    def test_raw_rows_round_trip_and_bad_rows(self, backend: Backend) -> None:
        dev = self.dsa_pool(backend)
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
        with pytest.raises(IndexError):
            dev.set_kv_rows(self.layer_num, loc, rows)
        with pytest.raises(IndexError):
            dev.get_kv_rows(0, loc + slot_count(dev))

    def test_packed_rows_have_no_split_accessors(self, backend: Backend) -> None:
        dev = self.dsa_pool(backend)
        loc = page_indices([1], 16)
        before = device_bytes(dev)
        nope = torch.zeros((loc.numel(), 1, 512), dtype=torch.uint8)
        rope = torch.zeros((loc.numel(), 1, 64), dtype=torch.uint8)
        with pytest.raises(PoolMismatchError, match="set_kv_rows"):
            dev.set_mla_kv_buffer(0, loc, nope, rope)
        with pytest.raises(PoolMismatchError, match="get_kv_rows"):
            dev.get_mla_kv_buffer(0, loc)
        assert same_bytes(before, device_bytes(dev))
        # kv_cache_dim equal to the split is the plain row: split accessors work.
        plain = self.mla_pool(
            backend, seed=4, kv_cache_dim=self.kv_lora_rank + self.qk_rope_head_dim
        )
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
            self.mla_pool(backend, kv_cache_dim=0)

    def test_dsa_rows_round_trip_every_pair(self, backend: Backend, pair: Pair) -> None:
        """DeepSeek-V3.2's rows (``dsa_pool``) with the indexer, bit-exact on every MLA pair."""
        dsa = next(k for k in KINDS if k.name == "dsa")
        options = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
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
        refused(LayerIndexError, dev, set_keys, 0, loc, keys, scales)  # a layer without indexer
        refused(PoolMismatchError, dev, set_keys, 1, loc, keys)  # no scale
        refused(PoolMismatchError, dev, set_keys, 1, loc, keys.repeat(1, 1, 2), scales)
        refused(PoolMismatchError, dev, set_keys, 1, loc, keys, scales[1:])
        refused(IndexError, dev, set_keys, 1, loc + 10**6, keys, scales)
        with pytest.raises(SGLError):
            self.mla_pool(backend, index_head_dim=8, indexer_layer_ids=[self.layer_num])
        with pytest.raises(SGLError):
            self.mla_pool(backend, indexer_layer_ids=[0])

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
                page_format(backend.create_host_pool(self.mla_pool(backend, **c), layout=layout))
                for c in configs
            ]
            prints = [f.fingerprint for f in formats]
            assert len(set(prints)) == len(prints), f"{layout}: {[f.describe() for f in formats]}"
