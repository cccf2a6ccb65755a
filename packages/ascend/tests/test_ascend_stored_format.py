"""Ascend page formats and flat-page bytes stay what the code before the KV-model redesign made.

``fixtures/formats_v2.json`` was written once by the code of version two
(before issue 23's one-model rewrite) with this file's ``write_fixture`` (run
``python packages/ascend/tests/test_ascend_stored_format.py`` to rewrite it —
only when a page format change is intended, and say so). Per case it holds
the pool's :func:`~sgl_core.l3.page_format` (every field), its fingerprint,
the host size a ``host_size_gb`` request gives, and the SHA-256 of each flat
page after a backup of device rows of a fixed byte pattern. A pool built the
same way today must match all of it: a change of a format identity (a stored
page would become a miss) or of a page's byte order (a hit would misread)
fails here.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import sgl_ascend
from sgl_core.l3 import page_format

FIXTURE = Path(__file__).parent / "fixtures" / "formats_v2.json"
PS = 4
LAYERS = 3

MLA = {"kv_lora_rank": 8, "qk_rope_head_dim": 4}
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mla-bf16": ("mla", "page_first_kv_split", {"dtype": torch.bfloat16, **MLA}),
    "mla-e4m3": ("mla", "page_first_kv_split", {"dtype": torch.float8_e4m3fn, **MLA}),
    "mla-packed-u8": (
        "mla",
        "page_first_kv_split",
        {"dtype": torch.uint8, **MLA, "kv_cache_dim": 20},
    ),
    "dsa-subset-scale": (
        "mla",
        "page_first_kv_split",
        {
            "dtype": torch.bfloat16,
            **MLA,
            "index_head_dim": 6,
            "indexer_layer_ids": [2, 0],
            "with_index_k_scale": True,
        },
    ),
    "dsa-every-noscale": (
        "mla",
        "page_first_kv_split",
        {"dtype": torch.bfloat16, **MLA, "index_head_dim": 6},
    ),
    "dsa-packed-fp32": (
        "mla",
        "page_first_kv_split",
        {
            "dtype": torch.float32,
            **MLA,
            "kv_cache_dim": 14,
            "index_head_dim": 2,
            "indexer_layer_ids": [1],
            "with_index_k_scale": True,
        },
    ),
    "mha-bf16": (
        "mha",
        "page_first_kv_split",
        {"dtype": torch.bfloat16, "head_num": 2, "head_dim": 8},
    ),
    "mha-narrow-v": (
        "mha",
        "page_first_kv_split",
        {"dtype": torch.float16, "head_num": 2, "head_dim": 8, "v_head_dim": 4},
    ),
    "mha-direct-name": (
        "mha",
        "page_first_direct",
        {"dtype": torch.bfloat16, "head_num": 1, "head_dim": 4, "v_head_dim": 6},
    ),
}


def _pattern(t: torch.Tensor, salt: int) -> torch.Tensor:
    """A fixed byte pattern in the shape and dtype of ``t`` (no RNG: stable across releases)."""
    n = t.numel() * t.element_size()
    raw = ((torch.arange(n, dtype=torch.int64) * 37 + salt * 11) % 251).to(torch.uint8)
    if t.dtype.is_floating_point and t.element_size() > 1:
        raw = raw % 64  # finite values of every float dtype (no NaN/inf bit patterns)
    return raw.view(t.dtype).view(t.shape)


def _build(case: str, gb: float = 0.0) -> tuple[Any, Any]:
    kind, layout, opts = CASES[case]
    backend = sgl_ascend.backend
    dev: Any
    if kind == "mla":
        dev = backend.create_device_pool(size=4 * PS, page_size=PS, layer_num=LAYERS, **opts)
    else:
        dev = backend.create_mha_device_pool(size=4 * PS, page_size=PS, layer_num=LAYERS, **opts)
    if gb:
        host = backend.create_host_pool(dev, layout=layout, host_size_gb=gb)
    else:
        host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=1.0)
    return dev, host


def _fill(dev: Any) -> None:
    names = ("k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer")
    for salt, name in enumerate(names):
        buf = getattr(dev, name, None)
        if buf is not None:
            buf.copy_(_pattern(buf, salt))


def record(case: str) -> dict[str, Any]:
    dev, host = _build(case)
    _fill(dev)
    device = torch.tensor([PS * p + i for p in (1, 3) for i in range(PS)])
    hosted = torch.tensor([PS * p + i for p in (2, 0) for i in range(PS)])
    host.backup_from_device_all_layer(dev, hosted, device, "kernel_ascend")
    pages = []
    for p in range(host.size // PS):
        page = host.get_data_page(p * PS).contiguous().view(torch.uint8)
        pages.append(hashlib.sha256(page.numpy().tobytes()).hexdigest())
    fmt = page_format(host)
    return {
        "format": fmt.as_dict(),
        "fingerprint": fmt.fingerprint,
        "pages": pages,
        "size_for_1e-5_gb": _build(case, 1e-5)[1].size,
    }


def write_fixture() -> None:
    FIXTURE.write_text(json.dumps({c: record(c) for c in CASES}, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("case", sorted(CASES))
def test_format_and_bytes_unchanged(case: str) -> None:
    stored = json.loads(FIXTURE.read_text())[case]
    assert record(case) == stored


if __name__ == "__main__":
    write_fixture()
    sys.exit(0)
