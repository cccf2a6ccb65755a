"""No source module of the three packages grows past 300 lines (Triton kernel files excepted).

A module that long usually holds two things; docs/design.md's module map
names one job per module. Triton kernel files (``sgl_cuda/_triton/``) are
excepted: a kernel and its launch constants read best in one place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 300
EXCEPTED = ("packages/cuda/src/sgl_cuda/_triton/",)


def too_long(root: Path) -> dict[str, int]:
    """Source modules under ``root``'s packages longer than ``LIMIT`` lines, by path."""
    out: dict[str, int] = {}
    for path in sorted(root.glob("packages/*/src/**/*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(EXCEPTED):
            continue
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > LIMIT:
            out[rel] = n
    return out


def test_no_source_module_is_over_the_limit() -> None:
    assert too_long(ROOT) == {}


def test_the_check_sees_a_long_module(tmp_path: Path) -> None:
    mod = tmp_path / "packages" / "core" / "src" / "pkg" / "long.py"
    mod.parent.mkdir(parents=True)
    mod.write_text("x = 1\n" * (LIMIT + 1))
    kernel = tmp_path / "packages" / "cuda" / "src" / "sgl_cuda" / "_triton" / "k.py"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("x = 1\n" * (LIMIT + 1))
    assert too_long(tmp_path) == {"packages/core/src/pkg/long.py": LIMIT + 1}


@pytest.mark.parametrize("lines", [LIMIT])
def test_a_module_at_the_limit_passes(tmp_path: Path, lines: int) -> None:
    mod = tmp_path / "packages" / "core" / "src" / "pkg" / "ok.py"
    mod.parent.mkdir(parents=True)
    mod.write_text("x = 1\n" * lines)
    assert too_long(tmp_path) == {}
