"""The KV kinds the conformance suite runs: one row of data per kind (docs/design.md, section 4).

Checks touch pools only through the kind-neutral byte helpers (``_helpers``),
so a check written once runs every kind.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

import torch

from sgl_core import Backend, HostLayout, IOBackend, MHADevicePool, MLADevicePool

__all__ = [
    "DSA_ROW_BYTES",
    "DevicePool",
    "HostPool",
    "KINDS",
    "KindCase",
    "Pair",
    "sorted_pairs",
]

Pair = tuple[HostLayout, IOBackend]
DevicePool = Union[MLADevicePool, MHADevicePool]  # noqa: UP007  (a runtime alias on 3.10)
#: A host pool of either kind. Its transfers take a device pool of its own
#: kind, which only the kind case knows, so the checks hold it untyped.
HostPool = Any


def sorted_pairs(pairs: Mapping[HostLayout, frozenset[IOBackend]]) -> Iterator[Pair]:
    """Every (layout, io backend) of ``pairs``, io backends in name order."""
    for layout, ios in pairs.items():
        for io in sorted(ios, key=lambda member: member.value):
            yield layout, io


@dataclass(frozen=True)
class KindCase:
    """One KV kind: the family (MLA or MHA) and the device-pool options that make it.

    ``dtype`` None: the suite's ``dtype``. MLA options are
    ``create_device_pool``'s (``kv_cache_dim`` packed rows, the DSA indexer on
    ``indexer_layer_ids``); an MHA case with ``narrow_v`` has V rows of the
    suite's ``mha_v_head_dim`` (K and V then differ in width).
    """

    name: str
    mha: bool = False
    dtype: torch.dtype | None = None
    kv_cache_dim: int | None = None
    index_head_dim: int | None = None
    indexer_layer_ids: tuple[int, ...] | None = None
    with_index_k_scale: bool = False
    narrow_v: bool = False

    @property
    def family(self) -> str:
        """What the pools' ``repr`` calls the kind (``kind=mla`` / ``kind=mha``)."""
        return "mha" if self.mha else "mla"

    @property
    def geometry(self) -> tuple[str, ...]:
        """The per-token sizes a host pool of this kind reports back (beyond layers, dtype)."""
        return ("head_num", "head_dim", "v_head_dim") if self.mha else ()

    def pairs(self, backend: Backend) -> Mapping[HostLayout, frozenset[IOBackend]]:
        """The (layout, io backends) the backend builds host pools of this kind with."""
        return backend.supported_mha_pairs if self.mha else backend.supported_pairs

    def default_io(self, backend: Backend, layout: HostLayout | str) -> IOBackend:
        return backend.default_mha_io(layout) if self.mha else backend.default_io(layout)

    def options(self) -> dict[str, Any]:
        """This kind's MLA row options (only those set); empty for MHA."""
        names = [] if self.kv_cache_dim is None else ["kv_cache_dim"]
        if self.index_head_dim is not None:
            names += ["index_head_dim", "indexer_layer_ids", "with_index_k_scale"]
        return {name: getattr(self, name) for name in names}

    def mismatches(self, device_pool: Any) -> dict[str, dict[str, Any]]:
        """Options (over this kind's) of pools that differ from ``device_pool`` in one field.

        A host pool built for ``device_pool`` must refuse each of them, byte-exact,
        and none shares its L3 page identity.
        Widths change by a factor, not an offset, so each still suits every
        layout its kind's pool suits (word-moving kernels take whole 8-byte words).
        """
        cases: dict[str, dict[str, Any]] = {
            "other layer_num": {"layer_num": 1 + device_pool.layer_num}
        }
        if self.kv_cache_dim is not None:
            cases["other kv_cache_dim"] = {"kv_cache_dim": 2 * self.kv_cache_dim}
        if self.mha:
            cases["other head_num"] = {"head_num": device_pool.head_num + 1}
            cases["other v_head_dim"] = {"v_head_dim": device_pool.v_head_dim * 2}
        elif self.index_head_dim is None:
            cases["an indexer"] = {
                "index_head_dim": 8,
                "indexer_layer_ids": [0],
                "with_index_k_scale": True,
            }
        else:  # every field of the indexer, and none
            cases["no indexer"] = {
                "index_head_dim": None,
                "indexer_layer_ids": None,
                "with_index_k_scale": False,
            }
            cases["other indexer layers"] = {"indexer_layer_ids": [1]}
            cases["other index_head_dim"] = {"index_head_dim": 2 * self.index_head_dim}
            cases["other index scale"] = {"with_index_k_scale": not self.with_index_k_scale}
        return cases


#: DeepSeek-V3.2's FP8 MLA row: 512 fp8 values, 4 fp32 scales, 64 bf16 rope values.
DSA_ROW_BYTES = 656

#: Every kind the suite runs by default (a backend without MHA pools runs the MLA ones).
KINDS: tuple[KindCase, ...] = (
    KindCase("mla"),
    KindCase("mla_packed", dtype=torch.uint8, kv_cache_dim=DSA_ROW_BYTES),
    # The indexer (keys and fp32 scales) on a subset of the layers, on split rows ...
    KindCase("mla_indexer", index_head_dim=8, indexer_layer_ids=(0, 2), with_index_k_scale=True),
    # ... and on DeepSeek-V3.2's packed rows, fp8-byte keys.
    KindCase(
        "dsa",
        dtype=torch.uint8,
        kv_cache_dim=DSA_ROW_BYTES,
        index_head_dim=16,
        indexer_layer_ids=(0, 2),
        with_index_k_scale=True,
    ),
    KindCase("mha", mha=True),
    KindCase("mha_narrow_v", mha=True, narrow_v=True),
)
