"""``sgl-bench hicache --model``: MHA/GQA models (llama3-70b, qwen3-235b) at tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_core.cli.main import main

TINY = ["--layers", "2", "--pages", "3", "--repeats", "1", "--warmup", "0"]


@pytest.mark.parametrize(("model", "heads"), [("llama3-70b", 8), ("qwen3-235b", 4)])
def test_mha_models_measure_every_mha_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, heads: int
) -> None:
    out = tmp_path / "h.json"
    argv = ["hicache", "--model", model, "--backend", "torch", "--page-size", "1,16"]
    assert main([*argv, "--shuffle-host", *TINY, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"model {model}: 2 layers x K+V {heads} heads x 128 bfloat16" in text
    assert "bit-exact: yes" in text
    records = json.loads(out.read_text())["records"]
    layouts = {"layer_first", "page_first", "page_first_direct", "page_head"}
    assert {r["layout"] for r in records} == layouts
    assert {r["impl"] for r in records} == {"sgl", "copy", "per_token", "per_page"}
    page = next(r for r in records if r["impl"] == "sgl" and r["page_size"] == 16)
    assert page["bytes"] == 3 * 16 * 2 * 2 * heads * 128 * 2  # pages x ps x layers x K+V x bytes
    assert all(r["bit_exact"] for r in records if r["impl"] != "copy")


def test_mla_stays_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hicache", "--backend", "torch", "--layout", "page_first", *TINY]) == 0
    assert "model deepseek-v3: 2 layers x (512+64)" in capsys.readouterr().out


def test_unknown_model_and_mla_only_layout_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hicache", "--model", "gpt-5", *TINY]) == 2
    assert "invalid choice: 'gpt-5'" in capsys.readouterr().err
    argv = ["hicache", "--model", "llama3-70b", "--backend", "torch"]
    assert main([*argv, "--layout", "page_first_kv_split", *TINY]) == 2
    assert "page_head" in capsys.readouterr().err
