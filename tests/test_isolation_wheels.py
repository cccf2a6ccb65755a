"""Each device package alone in a fresh environment, installed from its built wheel.

Three venvs (see ``_sgl_envs`` for how they share the pinned CPU torch):

* ``core``: sgl-core alone
* ``cuda``: sgl-core + sgl-cuda (+ triton, its real dependency)
* ``ascend``: sgl-core + sgl-ascend (no triton, no torch-npu)

In each, ``tests/_env_probe.py`` imports every module of every installed sgl
package and records what got loaded; the tests here assert on that report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _sgl_envs import IsolatedEnv, installed_distributions, newly_installed
from _sgl_support import ASCEND_STACK, CUDA_STACK, TESTS, TORCH_VERSION, TRITON_VERSION

ENVS = ("core", "cuda", "ascend")
FOREIGN: dict[str, tuple[str, ...]] = {
    "core": CUDA_STACK + ASCEND_STACK,
    "cuda": ASCEND_STACK,
    "ascend": CUDA_STACK,
}
FOREIGN_DISTS: dict[str, set[str]] = {
    "core": {"triton", "torch-npu", "sgl-cuda", "sgl-ascend"},
    "cuda": {"torch-npu", "sgl-ascend"},
    "ascend": {"triton", "torch-npu", "sgl-cuda"},
}
PACKAGES_IN: dict[str, set[str]] = {
    "core": {"sgl_core"},
    "cuda": {"sgl_core", "sgl_cuda"},
    "ascend": {"sgl_core", "sgl_ascend"},
}
ENTRY_POINTS: dict[str, list[str]] = {
    "core": [],
    "cuda": ["cuda=sgl_cuda:backend"],
    "ascend": ["ascend=sgl_ascend:backend"],
}
NOT_FOUND = "error:BackendNotFoundError"
# SGL_BACKEND value -> resolved backend name, on a machine without CUDA or NPU.
RESOLUTION: dict[str, dict[str, str]] = {
    "core": {"torch": "torch", "cuda": NOT_FOUND, "ascend": NOT_FOUND},
    "cuda": {"torch": "torch", "cuda": "cuda", "ascend": NOT_FOUND},
    "ascend": {"torch": "torch", "cuda": NOT_FOUND, "ascend": "ascend"},
}

EnvGetter = Callable[[str], IsolatedEnv]
_reports: dict[str, dict[str, Any]] = {}


def probe(isolated_env: EnvGetter, name: str) -> dict[str, Any]:
    """The probe's report for env ``name`` (run once per session)."""
    if name not in _reports:
        env = isolated_env(name)
        out = env.root / "probe.json"
        env.python_cmd(str(TESTS / "_env_probe.py"), str(out), timeout=300)
        _reports[name] = json.loads(out.read_text())
    return _reports[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_install_added_only_sgl_wheels(isolated_env: EnvGetter, name: str) -> None:
    """``pip install --no-index`` of the wheels resolved; it installed nothing else."""
    env = isolated_env(name)
    assert newly_installed(env.install_log) == set(env.dists), env.install_log


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_pip_check_clean(isolated_env: EnvGetter, name: str) -> None:
    result = isolated_env(name).pip_cmd("check", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No broken requirements found" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_environment_contents(isolated_env: EnvGetter, name: str) -> None:
    """Exactly the expected sgl distributions; torch from the pinned wheel; no foreign deps."""
    report = probe(isolated_env, name)
    dists = set(report["distributions"])
    assert {d for d in dists if d.startswith("sgl-")} == set(isolated_env(name).dists)
    assert not dists & FOREIGN_DISTS[name], dists & FOREIGN_DISTS[name]
    assert report["torch_version"].split("+")[0] == TORCH_VERSION
    # The sgl packages come from the wheels inside the venv, not from the source tree.
    for package in PACKAGES_IN[name]:
        assert report["module_files"][package].startswith(report["prefix"]), report["module_files"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_every_module_imports(isolated_env: EnvGetter, name: str) -> None:
    report = probe(isolated_env, name)
    modules: dict[str, str | None] = report["modules"]
    assert {m.split(".", 1)[0] for m in modules} == PACKAGES_IN[name]
    assert len(modules) > len(PACKAGES_IN[name]), "walk_packages found no submodules"
    failed = {m: err for m, err in modules.items() if err is not None}
    assert not failed, "\n\n".join(f"{m}: {err}" for m, err in failed.items())


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_no_foreign_module_loaded(isolated_env: EnvGetter, name: str) -> None:
    """After importing everything (and resolving backends), no other-device module is loaded."""
    report = probe(isolated_env, name)
    for stage in (
        "loaded_after_import_sgl_core",
        "loaded_after_listing",
        "loaded_after_auto",
        "loaded_after_all_imports",
    ):
        foreign = set(report[stage]) & set(FOREIGN[name])
        assert not foreign, f"{stage}: {sorted(foreign)} loaded in the {name} env"
    # Optional extras stay lazy: importing every module loads neither.
    assert "mooncake" not in report["loaded_after_all_imports"]
    assert "gguf" not in report["loaded_after_all_imports"]
    # Importing sgl_core alone loads no device package at all, wherever it is installed.
    assert report["loaded_after_import_sgl_core"] == ["sgl_core"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_foreign_dependency_not_installed(isolated_env: EnvGetter, name: str) -> None:
    """The other device's third-party stack is not even findable."""
    report = probe(isolated_env, name)
    findable = {m for m, found in report["find_spec"].items() if found}
    assert not findable & set(FOREIGN[name]), findable
    assert not report["find_spec"]["torch_npu"]  # never installed anywhere


@pytest.mark.slow
def test_triton_is_present_beside_sgl_cuda(isolated_env: EnvGetter) -> None:
    """Positive control: triton really is in the cuda env, so its absence elsewhere counts."""
    report = probe(isolated_env, "cuda")
    assert report["find_spec"]["triton"]
    assert "triton" in report["distributions"]
    assert report["versions"]["triton"] == TRITON_VERSION
    assert installed_distributions(isolated_env("cuda").shared[-1]) == {"triton"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_entry_points_discoverable(isolated_env: EnvGetter, name: str) -> None:
    report = probe(isolated_env, name)
    assert report["entry_points"] == ENTRY_POINTS[name]
    expected = sorted({"torch", *(e.split("=")[0] for e in ENTRY_POINTS[name])})
    assert report["available_backends"] == expected
    # Listing backends imports none of them.
    assert report["loaded_after_listing"] == ["sgl_core"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_get_backend_resolution(isolated_env: EnvGetter, name: str) -> None:
    """Resolution order (docs/design.md section 4): SGL_BACKEND, the one device backend, torch."""
    report = probe(isolated_env, name)
    # No NPU can be usable (torch_npu is never installed); CUDA only on a GPU runner.
    auto = "cuda" if name == "cuda" and report["cuda_available"] else "torch"
    assert report["auto_backend"] == auto
    for value, expected in RESOLUTION[name].items():
        assert report["sgl_backend_env"][value] == expected, (value, report["sgl_backend_env"])
        assert report["explicit"][value] == expected, (value, report["explicit"])
    assert report["sgl_backend_env"]["no-such-backend"] == NOT_FOUND


@pytest.mark.slow
@pytest.mark.parametrize("name", ENVS)
def test_env_is_isolated_from_the_runner(isolated_env: EnvGetter, name: str) -> None:
    """The probe ran on the venv's interpreter with the shared torch, not the runner's."""
    env = isolated_env(name)
    report = probe(isolated_env, name)
    assert Path(report["prefix"]).resolve() == env.root.resolve()
    assert Path(report["torch_file"]).resolve().is_relative_to(env.shared[0].resolve())
    # all three sgl wheels carry one version, and the env holds exactly that
    versions = report["versions"]
    assert {versions[d] for d in env.dists} == {versions["sgl-core"]}
