"""The built wheels are honest: typed, discoverable, and depend on what they say.

Reads each wheel (built this session from the working tree) with ``zipfile``
and ``email.parser``: ``py.typed``, the ``Typing :: Typed`` classifier, the
``sgl.backends`` entry point, Requires-Dist (no cross-device requirement; both
device packages pin ``sgl-core==<same version>``; torch-npu only behind the
``npu`` extra) and equal versions everywhere.
"""

from __future__ import annotations

import ast
import configparser
import email.parser
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from _sgl_envs import normalize
from _sgl_support import PACKAGES
from packaging.requirements import Requirement

DISTS = sorted(PACKAGES)
ENTRY_POINTS: dict[str, dict[str, str]] = {
    "sgl-core": {},
    "sgl-cuda": {"cuda": "sgl_cuda:backend"},
    "sgl-ascend": {"ascend": "sgl_ascend:backend"},
}
# Requirements (by normalized name) that must not appear at all, under any extra.
NEVER: dict[str, set[str]] = {
    "sgl-core": {"triton", "torch-npu", "sgl-cuda", "sgl-ascend", "sgl-kernel", "sgl-kernel-npu"},
    "sgl-cuda": {"torch-npu", "sgl-ascend", "sgl-kernel-npu"},
    "sgl-ascend": {"triton", "sgl-cuda", "sgl-kernel"},
}


def _dist_info(wheel: zipfile.ZipFile) -> str:
    (info,) = {n.split("/", 1)[0] for n in wheel.namelist() if ".dist-info/" in n}
    return info


def metadata(path: Path) -> Message:
    with zipfile.ZipFile(path) as wheel:
        text = wheel.read(f"{_dist_info(wheel)}/METADATA").decode()
    return email.parser.Parser().parsestr(text)


def entry_points(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    with zipfile.ZipFile(path) as wheel:
        name = f"{_dist_info(wheel)}/entry_points.txt"
        if name in wheel.namelist():
            parser.read_string(wheel.read(name).decode())
    return parser


def requirements(path: Path) -> list[Requirement]:
    return [Requirement(r) for r in metadata(path).get_all("Requires-Dist") or []]


def unconditional(reqs: list[Requirement]) -> dict[str, Requirement]:
    return {normalize(r.name): r for r in reqs if r.marker is None}


def test_all_three_wheels_built(built_wheels: dict[str, Path]) -> None:
    assert sorted(built_wheels) == DISTS
    for dist, path in built_wheels.items():
        assert path.name.endswith("-py3-none-any.whl"), path.name
        assert normalize(metadata(path)["Name"]) == dist


@pytest.mark.parametrize("dist", DISTS)
def test_wheel_carries_py_typed(built_wheels: dict[str, Path], dist: str) -> None:
    package = PACKAGES[dist][1]
    with zipfile.ZipFile(built_wheels[dist]) as wheel:
        assert f"{package}/py.typed" in wheel.namelist()


@pytest.mark.parametrize("dist", DISTS)
def test_wheel_holds_only_its_package(built_wheels: dict[str, Path], dist: str) -> None:
    """Nothing but the import package and its dist-info; no caches, tests or bytecode."""
    package = PACKAGES[dist][1]
    junk_dirs = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis"}
    junk_dirs |= {"tests"}
    with zipfile.ZipFile(built_wheels[dist]) as wheel:
        info = _dist_info(wheel)
        stray = [
            n
            for n in wheel.namelist()
            if not n.startswith((f"{package}/", f"{info}/"))
            or set(n.split("/")[:-1]) & junk_dirs
            or n.endswith((".pyc", ".pyo", ".so"))
        ]
    assert not stray, stray


@pytest.mark.parametrize("dist", DISTS)
def test_typed_classifier(built_wheels: dict[str, Path], dist: str) -> None:
    assert "Typing :: Typed" in (metadata(built_wheels[dist]).get_all("Classifier") or [])


def test_versions_in_lockstep(built_wheels: dict[str, Path]) -> None:
    """Same version in every wheel's METADATA and in each package's ``__version__``."""
    versions = {dist: metadata(path)["Version"] for dist, path in built_wheels.items()}
    assert len(set(versions.values())) == 1, versions
    for dist, path in built_wheels.items():
        package = PACKAGES[dist][1]
        with zipfile.ZipFile(path) as wheel:
            tree = ast.parse(wheel.read(f"{package}/__init__.py").decode())
        declared = [
            node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
        ]
        assert declared == [versions[dist]], (dist, declared, versions[dist])


@pytest.mark.parametrize("dist", ["sgl-cuda", "sgl-ascend"])
def test_device_packages_pin_core_exactly(built_wheels: dict[str, Path], dist: str) -> None:
    version = metadata(built_wheels["sgl-core"])["Version"]
    core = unconditional(requirements(built_wheels[dist])).get("sgl-core")
    assert core is not None, f"{dist} does not require sgl-core"
    assert str(core.specifier) == f"=={version}", f"{dist}: {core}"


@pytest.mark.parametrize("dist", DISTS)
def test_no_cross_device_requirement(built_wheels: dict[str, Path], dist: str) -> None:
    names = {normalize(r.name) for r in requirements(built_wheels[dist])}
    assert not names & NEVER[dist], f"{dist} requires {names & NEVER[dist]}"


def test_cuda_requires_triton(built_wheels: dict[str, Path]) -> None:
    assert "triton" in unconditional(requirements(built_wheels["sgl-cuda"]))


def test_torch_npu_only_behind_npu_extra(built_wheels: dict[str, Path]) -> None:
    path = built_wheels["sgl-ascend"]
    npu = [r for r in requirements(path) if normalize(r.name) == "torch-npu"]
    assert npu, "sgl-ascend should offer torch-npu as its npu extra"
    for req in npu:
        assert req.marker is not None, f"unconditional {req}"
        assert req.marker.evaluate({"extra": "npu"})
        assert not req.marker.evaluate({"extra": ""})
    assert "npu" in (metadata(path).get_all("Provides-Extra") or [])
    # and nothing else from the Ascend stack leaks into the default install
    assert "torch-npu" not in unconditional(requirements(path))


@pytest.mark.parametrize("dist", DISTS)
def test_backend_entry_point(built_wheels: dict[str, Path], dist: str) -> None:
    eps = entry_points(built_wheels[dist])
    group = dict(eps["sgl.backends"]) if eps.has_section("sgl.backends") else {}
    assert group == ENTRY_POINTS[dist]


@pytest.mark.parametrize("dist", DISTS)
def test_entry_point_targets_exist_in_wheel(built_wheels: dict[str, Path], dist: str) -> None:
    """Every entry point (backends, console scripts) names a module and attribute it ships."""
    eps = entry_points(built_wheels[dist])
    with zipfile.ZipFile(built_wheels[dist]) as wheel:
        names = set(wheel.namelist())
        for section in eps.sections():
            for ep_name, value in eps[section].items():
                module, _, attr = value.partition(":")
                base = module.replace(".", "/")
                source = next(
                    (p for p in (f"{base}.py", f"{base}/__init__.py") if p in names), None
                )
                assert source is not None, f"[{section}] {ep_name} = {value}: no module {module}"
                tree = ast.parse(wheel.read(source).decode())
                top = attr.split(".")[0].strip()
                bound = _bound_names(tree)
                assert top in bound, f"[{section}] {ep_name} = {value}: {top} not in {source}"


def _bound_names(tree: ast.Module) -> set[str]:
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return bound


LICENSE_TEXT = Path(__file__).resolve().parents[1] / "LICENSE"


def test_license_files_are_the_apache_text() -> None:
    """One Apache-2.0 text: the repository's, copied into each package (what its wheel ships)."""
    text = LICENSE_TEXT.read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    for dist in DISTS:
        project = PACKAGES[dist][0]
        assert (project / "LICENSE").read_text(encoding="utf-8") == text, dist


@pytest.mark.parametrize("dist", DISTS)
def test_wheel_ships_the_license(built_wheels: dict[str, Path], dist: str) -> None:
    meta = metadata(built_wheels[dist])
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(built_wheels[dist]) as wheel:
        shipped = wheel.read(f"{_dist_info(wheel)}/licenses/LICENSE").decode()
    assert shipped == LICENSE_TEXT.read_text(encoding="utf-8")


@pytest.mark.parametrize("dist", DISTS)
def test_long_description_says_what_how_where(built_wheels: dict[str, Path], dist: str) -> None:
    """The package README is the PyPI page: what it is, how to install it, where the docs are."""
    meta = metadata(built_wheels[dist])
    assert meta["Description-Content-Type"] == "text/markdown"
    body = meta.get_payload()
    assert isinstance(body, str)
    assert body.startswith(f"# {dist}")
    assert "## Install" in body and "python -m pip install" in body
    assert "docs/design.md" in body
    assert "DESIGN.md" not in body.replace("docs/design.md", "")
    assert "../" + "shared" not in body  # split: the literal would itself point outside
