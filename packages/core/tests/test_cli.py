"""``sgl-bench`` end to end at tiny shapes (hidden --layers/--pages/--tokens knobs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_core.cli.main import main

TINY = ["--layers", "3", "--pages", "4", "--repeats", "1", "--warmup", "0"]


def test_hicache_json_structure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "h.json"
    code = main(["hicache", "--backend", "torch", "--page-size", "1,16", *TINY, "--json", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "bit-exact: yes" in text
    doc = json.loads(out.read_text())
    assert {"cpu_count", "torch"} <= set(doc["machine"])
    records = doc["records"]
    keys = {"impl", "backend", "layout", "io_backend", "page_size", "direction", "bytes"}
    keys |= {"gbps", "copy_gbps", "ratio", "bit_exact"}
    for r in records:
        assert keys <= set(r)
        assert r["gbps"] > 0 and r["copy_gbps"] > 0
    impls = {r["impl"] for r in records}
    assert impls == {"sgl", "copy", "per_token", "per_page"}
    assert {r["layout"] for r in records} == {"layer_first", "page_first", "page_first_direct"}
    assert {r["page_size"] for r in records} == {1, 16}
    assert {r["direction"] for r in records} == {"backup", "load"}
    assert all(r["bit_exact"] for r in records if r["impl"] != "copy")


def test_hicache_all_backends_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "h.png"
    out = tmp_path / "h.json"
    args = ["hicache", "--backend", "all", "--page-size", "16", "--shuffle-host", *TINY]
    assert main([*args, "--json", str(out), "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    backends = {r["backend"] for r in json.loads(out.read_text())["records"]}
    assert "torch" in backends
    text = capsys.readouterr().out
    if "ascend" in text or "cuda" in text:  # device packages installed: mentioned or run
        assert "skipped backend 'cuda'" in text or "cuda" in backends or "ascend" in backends


def test_hicache_layout_filter_no_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["hicache", "--layout", "page_first", "--no-baselines", *TINY])
    assert code == 0
    text = capsys.readouterr().out
    assert "page_first/direct" in text
    assert "layer_first" not in text


@pytest.mark.parametrize(
    "argv",
    [
        ["hicache", "--page-size", "abc"],
        ["hicache", "--page-size", "0"],
        ["hicache", "--layout", "diagonal"],
        ["nosuchcommand"],
        [],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2


def test_unknown_backend_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hicache", "--backend", "nosuch", *TINY]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_verification_failure_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sgl_core.cli import _hicache

    def broken(t: _hicache.Transfer, *, to_host: bool, layer: int | None = None) -> None:
        _hicache.per_page(t, to_host=to_host, layer=layer)
        for comps in t.layers[:1]:
            for rows, _ in comps:
                rows.view(-1)[-1] += 1  # corrupt one element of the device pool

    monkeypatch.setitem(_hicache.BASELINES, "per_page", broken)
    assert main(["hicache", "--backend", "torch", "--layout", "layer_first", *TINY]) == 1
    assert "bit-exact: NO" in capsys.readouterr().out


def test_moe_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.json"
    png = tmp_path / "m.png"
    argv = [
        "moe",
        "--quick",
        "--no-device-methods",
        "--tokens",
        "64",
        "--hidden",
        "256",
        "--repeats",
        "2",
    ]
    assert main([*argv, "--json", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    impls = {r["impl"] for r in doc["records"]}
    assert {"fused", "unfused", "torch_moe"} <= impls
    assert all(r["verified"] for r in doc["records"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "verified: yes" in capsys.readouterr().out


# ---------------------------------------------------------------- exit status 2
HUGE = str(10**9)


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a benchmark starts: bad arguments are rejected before any work."""
    from sgl_core.cli import _hicache_cmd, _moe_cmd
    from sgl_core.l3 import _bench

    def ran(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran despite a bad argument")

    monkeypatch.setattr(_hicache_cmd, "run_case", ran)
    monkeypatch.setattr(_moe_cmd, "bench_combine", ran)
    monkeypatch.setattr(_bench, "run_l3_bench", ran)


def assert_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert lines[0].startswith("sgl-bench"), lines[0]
    assert captured.out == "", captured.out  # no table, no note: nothing ran
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["hicache", "--device", "bogus"], "not a torch device"),
        (["hicache", "--device", "meta"], "meta"),
        (["hicache", "--device", "cuda:99"], "cuda:99"),
        (["hicache", "--pages", HUGE], "host memory"),
        (["hicache", "--tokens", HUGE], "host memory"),
        (["hicache", "--page-size", "1,16", "--pages", "0"], "--pages"),
        (["hicache", "--repeats", "-1"], "--repeats must be > 0"),
        (["hicache", "--repeats", "0"], "--repeats must be > 0"),
        (["hicache", "--warmup", "-1"], "--warmup must be >= 0"),
        (["hicache", "--budget", "nan"], "--budget"),
        (["hicache", "--layers", "0"], "--layers"),
        (["hicache", "--backend", ","], "names no backend"),
        (["hicache", "--backend", "torch", "--layout", "page_first_kv_split"], "layouts"),
        (["hicache", "--page-size", "abc"], "--page-size"),
        (["hicache", "--page-size", "0"], "--page-size"),
        (["hicache", "--layout", "diagonal"], "diagonal"),
        (["hicache", "--pages", "two"], "--pages"),
        (["moe", "--device", "bogus"], "not a torch device"),
        (["moe", "--device", "meta"], "meta"),
        (["moe", "--repeats", "0"], "--repeats"),
        (["moe", "--tokens", HUGE], "host memory"),
        (["moe", "--hidden", "-3"], "--hidden"),
        (["l3", "--pages", "0"], "--pages"),
        (["l3", "--repeats", "-1"], "--repeats"),
        (["l3", "--page-size", "0"], "--page-size"),
        (["l3", "--layout", "diagonal"], "diagonal"),
        (["l3", "--layout", "page_first_kv_split"], "torch host pool"),
        (["l3", "--pages", HUGE], "host memory"),
        (["nosuchcommand"], "invalid choice"),
    ],
)
def test_bad_argument_is_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_usage_error(argv, capsys, needle)


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize("command", ["hicache", "moe", "l3"])
@pytest.mark.parametrize("where", ["missing_dir", "is_dir", "under_a_file"])
def test_unwritable_json_is_rejected_before_the_run(
    tmp_path: Path, command: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    path = {
        "missing_dir": tmp_path / "no" / "such" / "dir" / "out.json",
        "is_dir": tmp_path,
        "under_a_file": a_file / "out.json",
    }[where]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_usage_error([command, "--json", str(path)], capsys, "--json")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    assert a_file.read_text() == "x"


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize("command", ["hicache", "moe"])
def test_plot_without_matplotlib_says_install_the_extra(
    tmp_path: Path,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "p.png"
    assert_usage_error([command, "--plot", str(png)], capsys, "install sgl-core[bench]")
    assert not png.exists()


def test_unknown_backend_is_one_line_naming_the_installed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = assert_usage_error(["hicache", "--backend", "nosuch", *TINY], capsys, "'nosuch'")
    assert "torch" in line  # what is installed
    assert "sgl-nosuch" not in line  # no made-up distribution name


def test_bad_argument_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    for argv in (
        ["hicache", "--device", "meta", "--json", str(out)],
        ["hicache", "--page-size", "x"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "sgl_core.cli.main", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""
    assert not out.exists()


def test_help_states_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["hicache", "--help"], ["moe", "--help"], ["l3", "--help"]):
        assert main(argv) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "exit status: 0" in text and "1 = a verification failed" in text
        assert "2 = bad usage" in text


def test_pages_help_names_the_default_run_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hicache", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "2048 tokens' worth with --quick and in the default run, else 4096" in text


# ------------------------------------------------------------ self-explaining output
def test_hicache_output_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hicache", "--backend", "torch", *TINY]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    cases = len([ln for ln in lines if ln.startswith("page_first") or ln.startswith("layer_")]) // 2
    assert cases == 3
    assert "3 case(s) = backend torch x 3 layout/io x page 64" in lines[0]
    assert "rows: backup, load" in lines[0]
    # what one call moves, per page size: a backup all layers, a load one layer per call
    assert "one backup call moves all 3 layers; a load row times 3 calls, one layer" in out
    assert "page 64: 256 tokens = " in out and " MB per load call" in out
    # table rows and notes fit 100 columns; warnings, goals and the copy calibration's
    # reasons (printed only when this process measured something) are one line each
    notes = ("warning", "goal", "copy calibration:")
    assert [ln for ln in lines if len(ln) > 100 and not ln.lstrip().startswith(notes)] == []
    assert all(ln == ln.rstrip() for ln in lines)  # no trailing blanks
    for column in ("sgl/copy", "sgl/page", "sgl/token", "best", "min-max"):
        assert column in out
    assert "x per_page" not in out
    assert "copy = one contiguous copy_ of the same bytes" in out  # the limit
    assert "per_page = baseline" in out and "per_token = baseline" in out
    assert "sgl/X = sgl GB/s divided by X GB/s" in out
    assert "informational: they do not change the exit status" in out


def test_goal_lines_leave_out_interpreted_backends() -> None:
    from sgl_core.cli._hicache_table import legend, summarize, target_lines
    from sgl_core.cli._report import Record

    def rec(backend: str, impl: str, ratio: float) -> Record:
        return Record(impl, backend, "layer_first", "kernel", 64, "load", 1, 1.0, 1.0, 1.0,
                      ratio, 1, True, tokens=64, layers=1)  # fmt: skip

    records = [rec("cuda", "sgl", 0.01), rec("cuda", "copy", 1.0), rec("torch", "sgl", 0.9)]
    records.append(rec("torch", "copy", 1.0))
    lines = target_lines(records, {"cuda"})
    assert any("goal page >= 16 (ran 64)" in ln and "met (worst 0.90: torch" in ln for ln in lines)
    assert not any("cuda" in ln for ln in lines)
    assert target_lines(records[:2], {"cuda"}) == []  # nothing measured: no goals
    _, rows = summarize(records, {"cuda"})
    assert [r[0] for r in rows] == ["cuda*", "torch"]
    assert any("* cuda: Triton interpreter on CPU: GB/s not meaningful" in ln
               for ln in legend(records, {"cuda"}))  # fmt: skip
    assert not any(ln.startswith("  *") for ln in legend(records, set()))


def test_ratios_against_a_near_zero_baseline_are_marked() -> None:
    from sgl_core.cli._hicache_table import MIN_BASELINE_GBPS, legend, summarize
    from sgl_core.cli._report import Record

    def rec(impl: str, gbps: float) -> Record:
        return Record(impl, "torch", "page_first", "direct", 64, "backup", 1, 1.0, gbps, 4.0,
                      gbps / 4.0, 1, True, tokens=64, layers=1)  # fmt: skip

    slow = MIN_BASELINE_GBPS / 2
    records = [rec("sgl", 0.6), rec("copy", 4.0), rec("per_page", slow), rec("per_token", 0.3)]
    header, rows = summarize(records)
    cell = dict(zip(header, rows[0], strict=True))
    assert cell["sgl/page"] == f"{0.6 / slow:.2f}?"  # marked: the baseline barely moved bytes
    assert cell["sgl/token"] == "2.00" and cell["sgl/copy"] == "0.15"  # real baselines: plain
    note = f"? after a ratio = its baseline ran below {MIN_BASELINE_GBPS} GB/s"
    assert any(ln.strip().startswith(note) for ln in legend(records, set()))


def test_sgl_copy_spread_over_the_paired_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sgl_core.cli._hicache_table import summarize
    from sgl_core.cli._report import Record

    out = tmp_path / "h.json"
    argv = ["hicache", "--backend", "torch", "--layout", "page_first", "--page-size", "16"]
    assert main([*argv, *TINY[:-4], "--repeats", "3", "--warmup", "0", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for r in json.loads(out.read_text())["records"]:
        assert len(r["ratio_rounds"]) == r["samples"]  # one paired ratio per round
        if r["impl"] == "sgl":
            lo, hi = min(r["ratio_rounds"]), max(r["ratio_rounds"])
            assert f" {lo:.2f}-{hi:.2f} " in printed
    assert "min-max = the lowest and highest ratio of one round" in " ".join(printed.split())
    rec = Record("sgl", "torch", "page_first", "direct", 64, "load", 1, 1.0, 1.0, 2.0, 0.5, 3,
                 True, extra={"ratio_rounds": [0.6, 0.4, 0.5]})  # fmt: skip
    header, rows = summarize([rec])
    assert dict(zip(header, rows[0], strict=True))["min-max"] == "0.40-0.60"
    rec.extra.clear()  # records without rounds (older JSON): no spread invented
    assert dict(zip(header, summarize([rec])[1][0], strict=True))["min-max"] == "-"


def test_l3_lists_the_stores_it_left_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sgl_core.cli import _l3_cmd

    monkeypatch.setitem(sys.modules, "mooncake.store", None)  # import fails like a missing wheel
    assert "mooncake" in _l3_cmd.left_out_stores()
    assert main(["l3", "--pages", "2", "--layers", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "note: store 'mooncake' left out: its client does not import" in out
    assert out.count("store 'mooncake' left out") == 1, out  # one note, not two
    assert "pip install './packages/core[mooncake]'" in out  # the README's install, not an index
    assert "stores run: file" in out and "stores left out: mooncake" in out


def test_install_hints_name_the_repository_install() -> None:
    """No message or docstring suggests an index install (``pip install 'sgl-core[x]'``):
    the packages are on no index yet, the README installs ``./packages/<name>[extra]``."""
    import re

    src = Path(__file__).resolve().parents[2]  # packages/
    if not (src / "cuda" / "src").is_dir():  # an installed wheel's tests
        pytest.skip("the package sources are not here")
    index_install = re.compile(r"pip install ['\"]?sgl-(core|cuda|ascend)")
    found = [
        f"{path.relative_to(src)}:{n}"
        for path in sorted(src.glob("*/src/**/*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if index_install.search(line)
    ]
    assert not found, found


def test_mooncake_messages_name_the_repository_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from sgl_core.l3 import MooncakeUnavailableError, _mooncake_lib

    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    with pytest.raises(
        MooncakeUnavailableError, match=r"pip install './packages/core\[mooncake\]'"
    ):
        _mooncake_lib._import("mooncake.store")


# ------------------------------------------------------------ modes stated, not implied
def test_quick_and_full_together_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hicache", "--quick", "--full"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "selection", [["--backend", "torch"], ["--page-size", "16"], ["--layout", "page_first"]]
)
def test_a_selection_keeps_the_quick_mode(
    selection: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["hicache", *selection, *TINY]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "; quick: " in header and "full:" not in header


def test_l3_help_describes_only_l3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["l3", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "MoE" not in text
    assert "exit status: 0 = every result was verified (every page read back bit for bit)" in text


def test_moe_says_goal_and_what_rel_err_is(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["moe", "--quick", "--no-device-methods", "--tokens", "8", "--hidden", "64"]
    assert main([*argv, "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "goal combine fused >= 1.3x unfused" in out and "target " not in out
    assert "rel err = max |result - reference| / max |reference|" in out


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_moe_flags_interpreted_timings(
    interpret: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from sgl_core import MoEWeights
    from sgl_core.backend import MoEBenchCase
    from sgl_core.cli import _moe_cmd
    from sgl_core.moe._moe import TorchMoEMethod

    def fake(device: torch.device, small: bool) -> MoEBenchCase:
        gen = torch.Generator().manual_seed(0)
        w = MoEWeights(torch.randn(4, 64, 64, generator=gen), torch.randn(4, 64, 32, generator=gen))
        bf16 = MoEWeights(w.w13_weight.bfloat16(), w.w2_weight.bfloat16())
        return MoEBenchCase("fake_q", TorchMoEMethod(), bf16, w)

    monkeypatch.setattr(_moe_cmd, "moe_bench_factories", lambda: {"fake": fake})
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    argv = ["moe", "--quick", "--device", "cpu", "--tokens", "8", "--hidden", "64"]
    assert main([*argv, "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    flagged = "* fake_q: Triton interpreter on CPU: ms, GB/s and speedup not meaningful"
    assert (flagged in out) == (interpret == "1"), out
    assert (" fake_q* " in out) == (interpret == "1")
    assert "torch_dense*" not in out and "fused*" not in out  # torch ops are real timings


@pytest.mark.parametrize("load", [0.0, 1e6])
def test_hicache_states_the_load_and_warns_when_busy(
    load: float, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert main(["hicache", "--backend", "torch", "--layout", "page_first", *TINY]) == 0
    out = capsys.readouterr().out
    assert f"machine load (1-minute average) {load:.2f} at start, {load:.2f} at end" in out
    assert ("warning: the machine was busy" in out) == (load > 1)
