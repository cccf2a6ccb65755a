"""The import rules of docs/design.md section 2, checked two independent ways.

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
import shutil
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
    "device-packages-use-public-core",
    "core-imports-no-vllm",
    "core-folder-layers",
    "kv-layers",
    "copy-kit-knows-no-pool",
    "movers-import-no-host-pool",
    "movers-import-no-device-pool",
}
PRIVATE_CONTRACT = "device-packages-use-public-core"

# package -> top-level modules it must never import
FORBIDDEN: dict[str, frozenset[str]] = {
    "sgl_core": frozenset(
        {"sgl_cuda", "sgl_ascend", "triton", "torch_npu", "sgl_kernel", "sgl_kernel_npu", "vllm"}
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
# Device packages build on sgl_core's public modules (sgl_core.backend for backend
# authors), never on a private one: (importing module, private module) -> why allowed.
# (device module, private sgl_core module) -> why; empty: none is allowed.
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {}


# --- import-linter ---------------------------------------------------------------------


def configured_contracts() -> dict[str, str]:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {c["id"]: c["name"] for c in config["contracts"]}


def test_expected_contracts_configured() -> None:
    assert set(configured_contracts()) >= EXPECTED_CONTRACTS


def _lint_imports(src: list[Path], config: Path = PYPROJECT) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(path) for path in src)
    code = (
        "import sys; from importlinter.cli import lint_imports_command; "
        "sys.argv[0] = 'lint-imports'; lint_imports_command()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def test_import_linter_contracts_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter is part of the dev environment")
    returncode, output = _lint_imports([project / "src" for project, _ in PACKAGES.values()])
    assert returncode == 0, output
    for contract_id, name in configured_contracts().items():
        assert f"{name} KEPT" in output, f"contract {contract_id} not reported KEPT:\n{output}"
    assert "0 broken" in output, output


# sgl_core's public packages: device packages may import them (the AST scan below keeps
# them off their private modules). Every other package directly below sgl_core is an
# architecture folder of private modules (docs/design.md, module map).
PUBLIC_CORE_PACKAGES = frozenset({"l3", "testing", "integrations"})


def _private_core_modules() -> set[str]:
    """Top-level private modules and sgl_core's architecture folders.

    Every package directly below sgl_core that is not one of its public packages
    (``PUBLIC_CORE_PACKAGES``) holds private modules only and is forbidden whole.
    """
    src = PACKAGES["sgl-core"][0] / "src" / "sgl_core"
    found = set()
    for path in src.iterdir():
        name = path.stem if path.is_file() else path.name
        if name.startswith("__") or not (path.suffix == ".py" or (path / "__init__.py").exists()):
            continue
        if name.startswith("_") or (path.is_dir() and name not in PUBLIC_CORE_PACKAGES):
            found.add(f"sgl_core.{name}")
    return found


def test_private_contract_lists_every_private_core_module() -> None:
    """import-linter has no ``_*`` wildcard: a new folder or private module must join it."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == PRIVATE_CONTRACT]
    assert set(contract["source_modules"]) == {"sgl_cuda", "sgl_ascend"}
    private = _private_core_modules()
    assert {"sgl_core.transfer", "sgl_core.kv", "sgl_core.cli"} <= private
    assert private <= set(contract["forbidden_modules"])


def test_import_linter_breaks_on_a_private_core_import(tmp_path: Path) -> None:
    """Must-fail: the same config, on a copy of the sources plus one private import."""
    pytest.importorskip("importlinter", reason="import-linter is part of the dev environment")
    src = []
    for name, (project, package) in PACKAGES.items():
        dest = tmp_path / name
        shutil.copytree(
            project / "src" / package,
            dest / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        src.append(dest)
    bad = tmp_path / "sgl-ascend" / "sgl_ascend" / "_violation.py"
    bad.write_text(
        "from sgl_core.transfer.copy._copy import byte_view\n\n__all__ = ['byte_view']\n"
    )
    returncode, output = _lint_imports(src)
    assert returncode != 0, output
    name = configured_contracts()[PRIVATE_CONTRACT]
    assert f"{name} BROKEN" in output, output
    assert "sgl_ascend._violation -> sgl_core.transfer.copy._copy" in output, output
    for contract_id, other in configured_contracts().items():
        if contract_id != PRIVATE_CONTRACT:
            assert f"{other} KEPT" in output, output


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


PRIVATE_USERS = frozenset({"sgl_cuda", "sgl_ascend"})


def _module_part(imported: str) -> str:
    """``sgl_core.moe._moe.check_routing`` -> ``sgl_core.moe._moe`` (up to the first private
    part)."""
    parts = imported.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_"):
            return ".".join(parts[: i + 1])
    return imported


def violations(sites: list[ImportSite]) -> list[str]:
    """One message per (module, line, top-level module) that breaks a rule."""
    found: list[str] = []
    seen: set[tuple[str, int, str]] = set()
    for site in sites:
        package = site.module.partition(".")[0]
        private = (
            package in PRIVATE_USERS
            and site.root == "sgl_core"
            and any(part.startswith("_") for part in site.imported.split(".")[1:])
        )
        # ``from pkg import a`` yields ``pkg`` and ``pkg.a``: one message per rule and line
        key = (site.module, site.line, site.root + ("._" if private else ""))
        if key in seen:
            continue
        seen.add(key)
        where = f"{site.module}:{site.line} imports {site.imported}"
        if site.root in FORBIDDEN.get(package, frozenset()):
            if site.dynamic and (site.module, site.imported) in DYNAMIC_ALLOWED:
                continue
            found.append(f"{where} (forbidden in {package})")
        if private and (site.module, _module_part(site.imported)) not in PRIVATE_ALLOWED:
            found.append(f"{where} (private sgl_core module; use sgl_core.backend)")
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
    sites = list(imports_of(source, "sgl_core.cli.fake"))
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


def test_scanner_rejects_private_core_imports() -> None:
    """Must-fail: a device package importing a private sgl_core module, in any form."""
    source = """
from sgl_core.transfer.copy._copy import byte_view
import sgl_core.kv._validation
from sgl_core.l3._pages import x
from sgl_core.moe import _moe
from sgl_core.backend import byte_view
from sgl_core import errors
import sgl_core.testing
"""
    for module in ("sgl_cuda.kvcacheio", "sgl_ascend._transfer"):
        bad = violations(list(imports_of(source, module)))
        assert {int(b.split(":")[1].split()[0]) for b in bad} == {2, 3, 4, 5}, bad
        assert all("use sgl_core.backend" in b for b in bad)
    assert not violations(list(imports_of(source, "sgl_core.kv.host._token_host_pool")))
    once_allowed = "from sgl_core.moe._moe import check_routing"
    assert violations(list(imports_of(once_allowed, "sgl_cuda.quantization._method")))


def test_private_allowlist_is_current() -> None:
    """Each allowed private import still exists (drop the entry when the code goes)."""
    sites = {(s.module, _module_part(s.imported)) for s in package_imports()}
    stale = set(PRIVATE_ALLOWED) - sites
    assert not stale, f"stale PRIVATE_ALLOWED entries: {stale}"


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
