"""``sgl-bench hicache --background-load N`` and ``--compare-fixed`` (issue #27)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from sgl_core.cli import _hicache_cmd
from sgl_core.cli._hicache_cmd import busy_processes
from sgl_core.cli.main import main

TINY = ["--backend", "torch", "--layers", "2", "--pages", "2", "--repeats", "2", "--warmup", "0"]


class Spawned:
    """Every process ``busy_processes`` starts, kept to check they are gone."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        real = subprocess.Popen

        def popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
            proc = real(*args, **kwargs)  # type: ignore[call-overload]
            if _hicache_cmd.BUSY_CODE in proc.args:  # not platform's own `uname`
                self.procs.append(proc)
            return proc  # type: ignore[no-any-return]

        monkeypatch.setattr(subprocess, "Popen", popen)

    def all_gone(self) -> bool:
        return all(p.returncode is not None for p in self.procs)


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Spawned:
    return Spawned(monkeypatch)


def test_busy_processes_run_inside_the_block_and_are_gone_after(spawned: Spawned) -> None:
    with busy_processes(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert len(spawned.procs) == 2 and spawned.all_gone()


def test_busy_processes_are_stopped_on_an_error_and_on_ctrl_c(spawned: Spawned) -> None:
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)), busy_processes(1):
            raise exc
    assert len(spawned.procs) == 2 and spawned.all_gone()


def test_a_busy_process_ends_by_itself() -> None:
    with busy_processes(1, max_s=0.0) as procs:
        assert procs[0].wait(timeout=60) == 0  # its own time bound


def test_background_load_prints_quiet_and_loaded_tables(
    spawned: Spawned, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "h.json"
    argv = ["hicache", *TINY, "--background-load", "1", "--compare-fixed", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "\nquiet: host pool transfers" in text
    assert "\nloaded (1 busy process(es)): host pool transfers" in text
    assert text.count("copy calibration: ") == 2  # what calibration chose, after each table
    header = next(ln for ln in text.splitlines() if ln.startswith("layout "))
    for column in ("sgl/copy", "best", "min-max", "fixed/copy", "fixed best"):
        assert column in header
    assert "fixed = the same pools with the old fixed copy tuning" in " ".join(text.split())
    assert len(spawned.procs) == 1 and spawned.all_gone()
    doc = json.loads(out.read_text())
    assert doc["background_load"] == 1 and isinstance(doc["copy_calibration"], list)
    phases = {r["phase"] for r in doc["records"]}
    assert phases == {"quiet", "loaded"}
    impls = {r["impl"] for r in doc["records"]}
    assert {"sgl", "fixed", "copy"} <= impls and not any(i.startswith("copy@") for i in impls)
    assert all(r["bit_exact"] for r in doc["records"] if r["impl"] in {"sgl", "fixed"})
    for r in doc["records"]:
        assert r["best_ratio"] > 0 and len(r["ratio_rounds"]) == r["samples"]


def test_each_phase_prints_and_writes_how_its_team_calls_went(
    spawned: Spawned,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The streaming team's calls per phase (``team_calls`` before and after): the quiet
    phase's on the team, the loaded phase's on one thread; a phase with none prints none."""
    zero = {"team": 0, "busy": 0, "led": 0, "none": 0}
    counts = iter([zero, {**zero, "team": 5}, {**zero, "team": 5}, {**zero, "team": 5, "busy": 7}])
    monkeypatch.setattr(_hicache_cmd, "team_calls", lambda: next(counts))
    out = tmp_path / "h.json"
    assert main(["hicache", *TINY, "--background-load", "1", "--json", str(out)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "streaming team:" in ln]
    assert lines == [
        "  streaming team: 5 call(s) on the team, 0 on one thread (cores busy); over the "
        "pool: 0 (another thread led), 0 (no team)",
        "  streaming team: 0 call(s) on the team, 7 on one thread (cores busy); over the "
        "pool: 0 (another thread led), 0 (no team)",
    ]
    doc = json.loads(out.read_text())
    assert doc["stream_team"] == {"quiet": {**zero, "team": 5}, "loaded": {**zero, "busy": 7}}
    counts = iter([zero, zero])
    assert main(["hicache", *TINY]) == 0
    assert "streaming team:" not in capsys.readouterr().out


def test_the_busy_processes_are_stopped_when_the_run_fails(
    spawned: Spawned, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise RuntimeError("measurement failed")

    monkeypatch.setattr(_hicache_cmd, "run_case", fail)
    with pytest.raises(RuntimeError, match="measurement failed"):
        main(["hicache", *TINY, "--background-load", "2"])
    assert len(spawned.procs) == 0  # the quiet phase failed first: none were started
    calls = iter([None])

    def fail_loaded(*args: object) -> list[object]:
        if next(calls, "loaded") == "loaded":
            raise KeyboardInterrupt
        return []

    monkeypatch.setattr(_hicache_cmd, "run_case", fail_loaded)
    with pytest.raises(KeyboardInterrupt):
        main(["hicache", *TINY, "--layout", "page_first", "--background-load", "2"])
    assert len(spawned.procs) == 2 and spawned.all_gone()


@pytest.mark.parametrize("value", ["-1", "1000"])
def test_background_load_is_bounded(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hicache", *TINY, "--background-load", value]) == 2
    assert "--background-load must be" in capsys.readouterr().err


def test_the_reference_copy_is_the_faster_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from sgl_core.cli import _hicache

    def fake(
        ops: dict[tuple[str, str], object], **kw: object
    ) -> dict[tuple[str, str], list[float]]:
        got = {key: [1.0, 1.0] for key in ops}
        for d in ("backup", "load"):
            got[("copy@1", d)] = [4.0, 1.0]  # per round the faster count counts
            got[("copy@2", d)] = [2.0, 3.0]
        return got

    monkeypatch.setattr(_hicache, "time_interleaved", fake)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    from sgl_core.backends._discovery import get_backend
    from sgl_core.cli._hicache import run_case
    from sgl_core.cli._hicache_plan import Case, HicacheConfig
    from sgl_core.cli._report import Progress
    from sgl_core.kv._enums import HostLayout, IOBackend

    cfg = HicacheConfig(layers=2, pages=2, baselines=(), copy_threads=(1, 2))
    case = Case(get_backend("torch"), HostLayout.LAYER_FIRST, IOBackend.DIRECT, 16)
    records = run_case(case, cfg, Progress(1, "t", enabled=False))
    sgl = next(r for r in records if r.impl == "sgl")
    assert sgl.extra["ratio_rounds"] == [2.0, 1.0]  # min(4, 2) / 1 and min(1, 3) / 1
    assert sgl.ratio == 1.5 and sgl.extra["best_ratio"] == 1.0


def test_each_phase_prints_the_calls_whose_team_was_skipped(
    spawned: Spawned,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the calibrator's running totals, asked before and after each phase
    totals = iter([{}, {"copy k": ("1", 2)}, {"copy k": ("1", 2)}, {"copy k": ("2", 5)}])

    class Counts:
        def skipped(self) -> dict[str, tuple[str, int]]:
            return next(totals)

    monkeypatch.setattr(_hicache_cmd, "default_calibrator", Counts)
    out = tmp_path / "h.json"
    assert main(["hicache", *TINY, "--background-load", "1", "--json", str(out)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "had no free core" in ln]
    assert lines == [
        "  copy calibration: copy k: ATen's team had no free core on 2 call(s), which ran 1",
        "  copy calibration: copy k: ATen's team had no free core on 3 call(s), which ran 2",
    ]
    assert json.loads(out.read_text())["copy_team_skipped"] == {
        "quiet": {"copy k": {"ran": "1", "calls": 2}},
        "loaded": {"copy k": {"ran": "2", "calls": 3}},
    }


def test_the_run_names_the_streaming_copy_it_had(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header line and the JSON say which streaming copy kernel the run's copies were
    offered (or why none)."""
    monkeypatch.setattr(_hicache_cmd, "stream_copy_status", lambda: "available (k9)")
    out = tmp_path / "h.json"
    assert main(["hicache", *TINY, "--json", str(out)]) == 0
    header = capsys.readouterr().out.splitlines()[2]
    assert header == "streaming copy (CPU loads and backups): available (k9)"
    assert json.loads(out.read_text())["stream_copy"] == "available (k9)"
