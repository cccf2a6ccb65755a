"""The import rules of DESIGN §2, checked two independent ways.

1. import-linter with the repository's ``[tool.importlinter]`` contracts: every
   expected contract is configured and kept.
2. An AST scan of ``packages/*/src`` (a second line of defence that does not
   depend on import-linter's graph): every ``import``/``from ... import``
   statement, at any depth (functions, ``TYPE_CHECKING`` blocks, ``try``), and
   every ``importlib.import_module``/``__import__`` call with a literal name.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _sgl_support import PACKAGES, PYPROJECT, REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

EXPECTED_CONTRACTS = {
    "core-is-device-free",
    "cuda-never-imports-ascend",
    "ascend-never-imports-cuda",
    "triton-confined",
    "torch-npu-confined",
}

# package -> top-level modules it must never import
FORBIDDEN: dict[str, frozenset[str]] = {
    "sgl_core": frozenset(
        {"sgl_cuda", "sgl_ascend", "triton", "torch_npu", "sgl_kernel", "sgl_kernel_npu"}
    ),
    "sgl_cuda": frozenset({"sgl_ascend", "torch_npu", "sgl_kernel_npu"}),
    "sgl_ascend": frozenset({"sgl_cuda", "triton", "sgl_kernel"}),
}
# (top-level module, the only place in its package allowed to import it)
CONFINED: dict[str, tuple[str, str]] = {
    "triton": ("sgl_cuda", "sgl_cuda._triton"),
    "torch_npu": ("sgl_ascend", "sgl_ascend._npu"),
}
# Dynamic imports by name that cross a rule on purpose: (module, imported) -> why.
# Dynamic imports of another package that are allowed, with the reason. Empty:
# device packages reach sgl_core's tools through entry points instead.
DYNAMIC_ALLOWED: dict[tuple[str, str], str] = {}


# --- import-linter ---------------------------------------------------------------------


def configured_contracts() -> dict[str, str]:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {c["id"]: c["name"] for c in config["contracts"]}


def test_expected_contracts_configured() -> None:
    assert set(configured_contracts()) >= EXPECTED_CONTRACTS


def test_import_linter_contracts_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter is part of the dev environment")
    src = [str(project / "src") for project, _ in PACKAGES.values()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(src)
    code = (
        "import sys; from importlinter.cli import lint_imports_command; "
        "sys.argv[0] = 'lint-imports'; lint_imports_command()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "--no-cache", str(PYPROJECT)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for contract_id, name in configured_contracts().items():
        assert f"{name} KEPT" in output, f"contract {contract_id} not reported KEPT:\n{output}"
    assert "0 broken" in output, output


# --- AST scan --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ImportSite:
    module: str  # the importing module
    imported: str  # absolute dotted name
    line: int
    dynamic: bool

    @property
    def root(self) -> str:
        return self.imported.partition(".")[0]


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(source: str, module: str, *, is_package: bool = False) -> Iterator[ImportSite]:
    """Every import in ``source`` (static at any depth, and literal dynamic ones)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield ImportSite(module, alias.name, node.lineno, False)
        elif isinstance(node, ast.ImportFrom):
            target = (
                _resolve(module, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            yield ImportSite(module, target, node.lineno, False)
            for alias in node.names:  # `from pkg import submodule`
                if alias.name != "*":
                    yield ImportSite(module, f"{target}.{alias.name}", node.lineno, False)
        elif isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            first = node.args[0]
            if (
                func in ("importlib.import_module", "import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                yield ImportSite(module, first.value, node.lineno, True)


def package_imports() -> list[ImportSite]:
    sites: list[ImportSite] = []
    for project, package in PACKAGES.values():
        src = project / "src"
        for path in sorted((src / package).rglob("*.py")):
            sites += imports_of(
                path.read_text(), module_name(path, src), is_package=path.name == "__init__.py"
            )
    return sites


def violations(sites: list[ImportSite]) -> list[str]:
    """One message per (module, line, top-level module) that breaks a rule."""
    found: list[str] = []
    seen: set[tuple[str, int, str]] = set()
    for site in sites:
        if (site.module, site.line, site.root) in seen:
            continue
        seen.add((site.module, site.line, site.root))
        package = site.module.partition(".")[0]
        where = f"{site.module}:{site.line} imports {site.imported}"
        if site.root in FORBIDDEN.get(package, frozenset()):
            if site.dynamic and (site.module, site.imported) in DYNAMIC_ALLOWED:
                continue
            found.append(f"{where} (forbidden in {package})")
        confined = CONFINED.get(site.root)
        if confined and confined[0] == package:
            allowed = confined[1]
            if site.module != allowed and not site.module.startswith(allowed + "."):
                found.append(f"{where} (only {allowed} may import {site.root})")
    return found


def test_scanner_sees_every_import_form() -> None:
    """The scanner is not vacuous: each form of a forbidden import is caught."""
    source = """
import triton
import triton.language as tl
from sgl_ascend import backend
from torch_npu.contrib import x
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from sgl_kernel import y
def f():
    import sgl_kernel_npu
    importlib.import_module("sgl_cuda.quantization")
    __import__("torch_npu")
try:
    from .. import sgl_cuda_stub
except ImportError:
    pass
"""
    sites = list(imports_of(source, "sgl_core._cli.fake"))
    bad = violations(sites)
    expected_roots = {"triton", "sgl_ascend", "torch_npu", "sgl_kernel", "sgl_kernel_npu"}
    assert {s.root for s in sites} >= expected_roots | {"sgl_cuda", "sgl_core"}
    assert {int(b.split(":")[1].split()[0]) for b in bad} == {2, 3, 4, 5, 8, 10, 11, 12}, bad
    assert any(s.imported == "sgl_core.sgl_cuda_stub" for s in sites)  # relative resolved
    confined = violations(list(imports_of("import triton", "sgl_cuda.kvcacheio")))
    assert confined == [
        "sgl_cuda.kvcacheio:1 imports triton (only sgl_cuda._triton may import triton)"
    ]
    assert not violations(list(imports_of("import triton", "sgl_cuda._triton.ggml")))
    assert not violations(list(imports_of("import torch_npu", "sgl_ascend._npu")))


def test_scanner_found_the_packages() -> None:
    sites = package_imports()
    assert {s.module.partition(".")[0] for s in sites} == set(FORBIDDEN)
    # the confined imports exist, so the scan does see them
    assert any(s.root == "triton" for s in sites)
    assert any(s.root == "torch_npu" for s in sites)


def test_no_forbidden_import_in_sources() -> None:
    bad = violations(package_imports())
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_dynamic_import_allowlist_is_current() -> None:
    """Each allowed dynamic import still exists (drop the entry when the code goes)."""
    dynamic = {(s.module, s.imported) for s in package_imports() if s.dynamic}
    stale = set(DYNAMIC_ALLOWED) - dynamic
    assert not stale, f"stale DYNAMIC_ALLOWED entries: {stale}"
