"""``sgl-bench hicache --backend cuda`` without a GPU: the note and the behaviour agree.

Run in a fresh process without ``TRITON_INTERPRET``, as a user would: the
command turns the interpreter on itself (before the kernels are defined),
says so, shrinks the run and marks the GB/s as not meaningful; the round
trips are still checked bit for bit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", "sgl_core.cli.main", "hicache", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_cuda_on_cpu_runs_in_the_interpreter_it_announces() -> None:
    proc = _bench("--backend", "cuda", "--layout", "page_first", "--no-baselines")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "this run set TRITON_INTERPRET=1" in out
    assert "shrunk to 4 layers x 256 tokens" in out
    # one io in the selection: named once in the header, the row names the layout
    assert "io kernel" in out
    assert re.search(r"^cuda\*\s+page_first\s+64\s+backup\s", out, re.MULTILINE)
    assert "GB/s not meaningful" in out
    assert "goal " not in out  # no performance goal is judged on interpreter numbers
    assert "bit-exact: yes" in out
    assert "Traceback" not in proc.stderr


def test_the_measured_cuda_path_is_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``SGL_CUDA_DIRECT_COPY=auto`` the run says what each kind of transfer took."""
    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "auto")
    proc = _bench("--backend", "cuda", "--layout", "page_first_direct", "--no-baselines")
    assert proc.returncode == 0, proc.stderr
    found = re.findall(
        r"copy calibration: cuda (backup|load) cpu->cpu page_first_direct .*", proc.stdout
    )
    assert sorted(set(found)) == ["backup", "load"], proc.stdout
    assert "slowest rounds copy engine: " in proc.stdout
    assert "bit-exact: yes" in proc.stdout


def test_cuda_is_left_out_of_all_with_the_reason() -> None:
    proc = _bench("--backend", "all", "--layers", "2", "--pages", "2", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr
    assert "backend 'cuda' left out: no CUDA device here" in proc.stdout
    # The header counts the cases that ran: torch's (and Ascend's, where it is installed).
    assert re.search(r"= backend (ascend, )?torch x ", proc.stdout), proc.stdout
    assert not any(line.startswith("cuda") for line in proc.stdout.splitlines())
