"""``sgl-bench hicache --model deepseek-v32``: packed rows plus the indexer, end to end (tiny)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_core.cli import _hicache
from sgl_core.cli.main import main

TINY = ["--layers", "3", "--pages", "2", "--repeats", "1", "--warmup", "0", "--no-baselines"]


def test_deepseek_v32_moves_rows_and_indexer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "v32.json"
    argv = ["hicache", "--backend", "torch", "--model", "deepseek-v32", "--page-size", "16"]
    argv += ["--layout", "page_first_direct"]
    assert main([*argv, *TINY, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "656 packed uint8 + indexer 128 uint8 + fp32 scale" in text
    assert "bit-exact: yes" in text
    records = json.loads(out.read_text())["records"]
    # Every record counts the indexer bytes: 3 layers x (656 + 128 + 4) bytes per token.
    assert {r["bytes"] for r in records} == {2 * 16 * 3 * (656 + 128 + 4)}
    assert all(r["model"] == "deepseek-v32" and r["best_gbps"] >= r["gbps"] for r in records)


def test_deepseek_v32_verification_covers_the_indexer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline that drops the indexer components fails the bit-exact check (exit 1)."""
    real = _hicache.per_page

    def kv_only(t: _hicache.Transfer, *, to_host: bool, layer: int | None = None) -> None:
        saved = t.layers
        t.layers = [comps[:1] for comps in saved]
        try:
            real(t, to_host=to_host, layer=layer)
        finally:
            t.layers = saved

    monkeypatch.setitem(_hicache.BASELINES, "per_page", kv_only)
    argv = ["hicache", "--backend", "torch", "--model", "deepseek-v32", "--layout", "page_first"]
    tiny = [a for a in TINY if a != "--no-baselines"]
    assert main([*argv, "--page-size", "16", *tiny]) == 1
    assert "bit-exact: NO" in capsys.readouterr().out
