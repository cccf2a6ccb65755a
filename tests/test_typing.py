"""Downstream code typed against the sgl_core protocols, checked by ``mypy --strict``.

* ``tests/typing/pass/*.py``: integrations written the way an engine uses us
  (cache controller over ``MLAHostPool``/``MLADevicePool``, an MoE layer with its
  own ``MoEMethod``, every backend class against its protocol). No error allowed.
* ``tests/typing/fail/*.py``: misuse. Each ``# E: code[, code]`` comment is an
  error mypy must report on that line; the reported set must equal the expected
  set exactly (line and code), so the protocols are proven to constrain callers.

One mypy run (the repo's ``[tool.mypy]`` config, strict) covers every file
here plus each package module holding an ``if TYPE_CHECKING:`` conformance line
(so those lines are checked, with everything they import); the incremental
cache lives under the test cache root, one per checkout. The packages as a
whole are type-checked by ``hatch run types``.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import os
import re
from pathlib import Path

import pytest
from _sgl_support import PACKAGES, PYPROJECT, REPO, TESTS, cache_root

import sgl_core

PASS_DIR = TESTS / "typing" / "pass"
FAIL_DIR = TESTS / "typing" / "fail"
PASS_FILES = sorted(PASS_DIR.glob("*.py"))
FAIL_FILES = sorted(FAIL_DIR.glob("*.py"))
EXPECT = re.compile(r"#\s*E:\s*(?P<codes>[a-z0-9-]+(?:\s*,\s*[a-z0-9-]+)*)\s*$")
REPORT = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*?)"
    r"(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)


@dataclasses.dataclass(frozen=True)
class MypyError:
    path: Path
    line: int
    code: str
    message: str


@dataclasses.dataclass(frozen=True)
class MypyRun:
    errors: tuple[MypyError, ...]
    stdout: str
    stderr: str
    status: int

    def in_file(self, path: Path) -> list[MypyError]:
        return [e for e in self.errors if e.path == path.resolve()]


def expected_errors(path: Path) -> set[tuple[int, str]]:
    """``(line, code)`` pairs from the ``# E:`` comments of a fail module."""
    found: set[tuple[int, str]] = set()
    for lineno, text in enumerate(path.read_text().splitlines(), start=1):
        match = EXPECT.search(text)
        if match:
            found.update((lineno, c.strip()) for c in match.group("codes").split(","))
    return found


def parse_report(stdout: str) -> tuple[MypyError, ...]:
    errors = []
    for raw in stdout.splitlines():
        match = REPORT.match(raw)
        if match is None or match.group("severity") != "error":
            continue
        errors.append(
            MypyError(
                path=(REPO / match.group("path")).resolve(),
                line=int(match.group("line")),
                code=match.group("code") or "<no code>",
                message=match.group("message"),
            )
        )
    return tuple(errors)


PROTOCOLS = ("Backend", "MLADevicePool", "MLAHostPool", "MoEMethod")


def _type_checking_annotations(tree: ast.Module) -> set[str]:
    """Annotation names of assignments inside ``if TYPE_CHECKING:`` blocks."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")):
            continue
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.AnnAssign):
                names.add(ast.unparse(stmt.annotation).rsplit(".", 1)[-1])
    return names


def package_sources(package: str) -> list[Path]:
    project = next(project for project, name in PACKAGES.values() if name == package)
    return sorted((project / "src" / package).rglob("*.py"))


def conformance_modules() -> list[Path]:
    """Package modules that assign a concrete class to a protocol for mypy."""
    return [
        source
        for _, package in PACKAGES.values()
        for source in package_sources(package)
        if _type_checking_annotations(ast.parse(source.read_text(), str(source))) & set(PROTOCOLS)
    ]


def mypy_cache_dir() -> Path:
    """An incremental cache per checkout.

    mypy replays the errors it cached for an unchanged file, with the absolute
    paths of the run that cached them; a cache shared by two clones would report
    the other clone's paths, so the key is this checkout's location.
    """
    checkout = hashlib.sha256(str(REPO.resolve()).encode()).hexdigest()[:16]
    return cache_root() / "mypy" / checkout


@pytest.fixture(scope="module")
def mypy_run() -> MypyRun:
    api = pytest.importorskip("mypy.api", reason="mypy is part of the dev environment")
    args = [
        "--config-file",
        str(PYPROJECT),
        "--cache-dir",
        str(mypy_cache_dir()),
        "--no-error-summary",
        "--show-error-codes",
        "--no-pretty",
        "--hide-error-context",
        "--show-absolute-path",
    ]
    args += [str(p.relative_to(REPO)) for p in conformance_modules()]
    args += [str(p.relative_to(REPO)) for p in PASS_FILES + FAIL_FILES]
    previous = Path.cwd()
    os.chdir(REPO)  # mypy_path in [tool.mypy] is relative to the repository root
    try:
        stdout, stderr, status = api.run(args)
    finally:
        os.chdir(previous)
    return MypyRun(parse_report(stdout), stdout, stderr, status)


def _describe(errors: list[MypyError]) -> str:
    return "\n".join(f"{e.path.name}:{e.line}: [{e.code}] {e.message}" for e in errors)


def test_fixtures_present() -> None:
    assert len(PASS_FILES) >= 3, PASS_FILES
    assert len(FAIL_FILES) >= 2, FAIL_FILES


def test_mypy_ran(mypy_run: MypyRun) -> None:
    # Status 1 is "type errors found" (the fail modules); 2 is a crash or bad usage.
    assert mypy_run.status == 1, mypy_run.stdout + mypy_run.stderr
    assert mypy_run.errors, "mypy reported nothing: the fail modules were not checked"


def test_no_errors_outside_fail_modules(mypy_run: MypyRun) -> None:
    """The packages (with their conformance lines) and the pass modules are clean."""
    fail = {p.resolve() for p in FAIL_FILES}
    stray = [e for e in mypy_run.errors if e.path not in fail]
    assert not stray, "unexpected mypy errors:\n" + _describe(stray)


@pytest.mark.parametrize("path", PASS_FILES, ids=lambda p: p.stem)
def test_pass_module_is_clean(mypy_run: MypyRun, path: Path) -> None:
    errors = mypy_run.in_file(path)
    assert not errors, _describe(errors)


@pytest.mark.parametrize("path", FAIL_FILES, ids=lambda p: p.stem)
def test_fail_module_errors_exactly(mypy_run: MypyRun, path: Path) -> None:
    expected = expected_errors(path)
    assert expected, f"{path.name} has no '# E: code' annotations"
    got = {(e.line, e.code) for e in mypy_run.in_file(path)}
    missing = sorted(expected - got)
    unexpected = [e for e in mypy_run.in_file(path) if (e.line, e.code) not in expected]
    assert not missing, f"{path.name}: expected but not reported (line, code): {missing}"
    assert not unexpected, f"{path.name}: reported but not expected:\n{_describe(unexpected)}"


def _load(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(f"_sgl_typing_pass_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["cache_controller", "mha_cache_controller", "moe_layer"])
def test_pass_module_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The typed integrations are real code: they run against ``get_backend()`` here."""
    monkeypatch.delenv("SGL_BACKEND", raising=False)
    sgl_core.clear_backend_cache()
    try:
        demo = getattr(_load(PASS_DIR / f"{name}.py"), "demo")  # noqa: B009
        demo()
    finally:
        sgl_core.clear_backend_cache()


# Each package's static conformance lines: protocol -> classes assigned to it
# inside `if TYPE_CHECKING:` somewhere in the package (docs/design.md section 2, issue 6).
REQUIRED_CONFORMANCE: dict[str, set[str]] = {
    "sgl_core": {
        "Backend",
        "MHADevicePool",
        "MHAHostPool",
        "MLADevicePool",
        "MLAHostPool",
        "MoEMethod",
    },
    "sgl_cuda": {"Backend", "MLADevicePool", "MLAHostPool", "MoEMethod"},
    "sgl_ascend": {
        "Backend",
        "MHADevicePool",
        "MHAHostPool",
        "MLADevicePool",
        "MLAHostPool",
        "MoEMethod",
    },
}


@pytest.mark.parametrize("package", sorted(REQUIRED_CONFORMANCE))
def test_static_conformance_lines_present(package: str) -> None:
    """Each package states, for mypy, that its classes satisfy the protocols."""
    found: set[str] = set()
    for source in package_sources(package):
        found |= _type_checking_annotations(ast.parse(source.read_text(), str(source)))
    missing = REQUIRED_CONFORMANCE[package] - found
    assert not missing, f"{package} has no `if TYPE_CHECKING: _x: <P> = ...` line for {missing}"
