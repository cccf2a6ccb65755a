"""``benchmarks/gpu_hicache.py`` end to end in its tiny CPU mode (interpreter).

The GPU check runs this script once on a lent machine; every code path of it
(main table with every direct mode, sweep, SM budget, ncu target) runs
here first, so that run cannot fail for a reason a CPU could have caught.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the tiny CPU mode needs the interpreter (no GPU)"
)


def test_tiny_run_writes_exact_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_hicache

    out = tmp_path / "h.json"
    argv = [str(out), "--device", "cpu", "--tiny", "--pages", "4", "--foreach-pages", "4"]
    assert gpu_hicache.main(argv) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    modes = {(r["layout"], r["io"], r["mode"]) for r in rows}
    assert ("page_first_direct", "direct", "foreach") in modes
    assert ("layer_first", "direct", "batch") in modes
    assert ("layer_first", "direct", "auto") in modes
    # what auto picked is in the JSON the GPU check brings back (kernel measured where it runs)
    picked = [c for c in data["meta"]["copy_calibration"] if c["key"].startswith("cuda ")]
    assert any("layer_first" in c["key"] and "kernel" in c["seconds"] for c in picked)
    assert all(c["choice"] in c["seconds"] for c in picked)
    assert all(r["exact"] and not r["error"] for r in rows)
    assert len(data["sweep"]["rows"]) > 30 and all(r["exact"] for r in data["sweep"]["rows"])
    assert len(data["smbudget"]["rows"]) == 11
    assert gpu_hicache.main([str(out), "--summarize"]) == 0  # the script's fallback view
    assert gpu_hicache.main([str(out), "--device", "cpu", "--tiny", "--ncu-target"]) == 0
    # Past --budget-s no page size starts; what was measured is still written.
    argv = [str(out), "--device", "cpu", "--tiny", "--pages", "4,8", "--budget-s", "1e-9"]
    assert gpu_hicache.main([*argv, "--skip", "sweep,smbudget"]) == 0
    assert json.loads(out.read_text())["meta"]["skipped_pages"] == [4, 8]
    sys.modules.pop("gpu_hicache_extra", None)
