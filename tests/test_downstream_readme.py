"""The README, followed by a downstream user: its example runs against the installed wheels.

Each isolated environment (see ``test_isolation_wheels``) holds only the
wheels built this session. The README's python example runs there, unchanged,
on that environment's backend (the cuda backend on a machine without a GPU
under ``TRITON_INTERPRET=1``, as the README says), and prints what it did.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from _sgl_envs import IsolatedEnv

ROOT = Path(__file__).resolve().parents[1]
# env -> (backend the example is pointed at, environment it needs on a CPU machine,
#         the layout/io pair it must report: the backend's first layout and default_io)
CASES: dict[str, tuple[str, dict[str, str], str]] = {
    "core": ("torch", {}, "layer_first/direct"),
    "cuda": ("cuda", {"TRITON_INTERPRET": "1"}, "layer_first/kernel"),
    "ascend": ("ascend", {}, "page_first_kv_split/kernel_ascend"),
}


def _example(dest: Path) -> Path:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    path = dest / "readme_example.py"
    path.write_text(blocks[0], encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_readme_example_in_a_clean_install(
    isolated_env: Callable[[str], IsolatedEnv], name: str
) -> None:
    env = isolated_env(name)
    backend, extra, pair = CASES[name]
    script = _example(env.root)
    result = env.python_cmd(str(script), extra_env={"SGL_BACKEND": backend, **extra})
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{backend}: {pair}: "), result.stdout
    assert lines[0].endswith("identical: True"), result.stdout
    assert lines[1].endswith("as expected: True"), result.stdout


@pytest.mark.slow
def test_bench_bad_argument_in_a_clean_install(
    isolated_env: Callable[[str], IsolatedEnv],
) -> None:
    env = isolated_env("core")
    bench = env.root / "bin" / "sgl-bench"
    result = env.python_cmd(str(bench), "hicache", "--device", "meta", check=False)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    unknown = env.python_cmd(
        "-c",
        "import sgl_core\ntry:\n    sgl_core.get_backend('bogus')\n"
        "except sgl_core.errors.BackendNotFoundError as e:\n    print(e)",
    )
    assert "installed: torch" in unknown.stdout
    assert "sgl-bogus" not in unknown.stdout
    assert "cuda (sgl-cuda)" in unknown.stdout
