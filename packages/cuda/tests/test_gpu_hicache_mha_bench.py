"""``benchmarks/gpu_hicache_mha.py`` end to end in its tiny CPU mode (interpreter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="the tiny CPU mode needs the interpreter (no GPU)"
    ),
]


def test_tiny_run_writes_exact_rows_for_every_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_hicache_mha

    out = tmp_path / "m.json"
    assert gpu_hicache_mha.main([str(out), "--device", "cpu", "--tiny", "--shuffle-host"]) == 0
    data = json.loads(out.read_text())
    assert data["shuffle_host"] is True
    rows = data["rows"]
    pairs = {(r["layout"], r["io"]) for r in rows}
    assert pairs == {
        ("layer_first", "kernel"),
        ("layer_first", "direct"),
        ("page_first", "kernel"),
        ("page_first_direct", "direct"),
        ("page_head", "kernel"),
    }
    assert len(rows) == 2 * 2 * len(pairs)  # 2 page sizes x (backup, load)
    assert all(r["exact"] for r in rows)
