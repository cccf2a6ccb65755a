"""The README's usage example runs as written, and its two commands are the documented ones."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_usage_example_runs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["out"] is not None


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = "python -m pip install hatch && python -m hatch run all"
    assert command in readme
    assert command in ci
