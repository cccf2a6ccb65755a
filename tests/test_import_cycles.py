"""No import cycles among the modules of the three packages (docs/design.md section 2).

Computed from the source: every ``import`` and ``from ... import`` anywhere in
a module counts, under ``TYPE_CHECKING`` and inside functions too. ``from pkg
import sub`` depends on ``pkg.sub`` (a submodule), not on ``pkg``'s own names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "sgl_core": ROOT / "packages/core/src",
    "sgl_cuda": ROOT / "packages/cuda/src",
    "sgl_ascend": ROOT / "packages/ascend/src",
}


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg, src in packages.items():
        for path in sorted((src / pkg).rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules of ``known`` that ``module`` imports."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names]
            names = subs if all(s in known for s in subs) else [base, *subs]
        else:
            continue
        yield from (n for n in names if n in known and n != module)


def cycles(packages: dict[str, Path]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    known = modules(packages)
    graph = {m: sorted(set(imported(m, p, known))) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert cycles(PACKAGES) == []


def test_the_cycle_finder_sees_type_checking_and_local_imports(tmp_path: Path) -> None:
    """Must-fail: a cycle closed only under TYPE_CHECKING, another only in a function."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg._b import B\n"
    )
    (pkg / "_b.py").write_text("from pkg import _a\n")
    (pkg / "_c.py").write_text("def f():\n    from pkg._d import D\n")
    (pkg / "_d.py").write_text("from ._c import f\n")
    (pkg / "_e.py").write_text("from pkg import _a\n")  # one way only: no cycle
    assert cycles({"pkg": tmp_path}) == [["pkg._a", "pkg._b"], ["pkg._c", "pkg._d"]]
