"""Session fixtures of the cross-package tests: built wheels and fresh environments.

The expensive parts are cached under the test cache root (see ``_sgl_envs``);
wheels and venvs are rebuilt every session from the current sources.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _sgl_envs import (
    IsolatedEnv,
    build_wheels,
    create_env,
    remove_stale_sessions,
    shared_torch,
    shared_triton,
)
from _sgl_support import cache_root

# env name -> distributions installed from this session's wheels
ENV_DISTS: dict[str, tuple[str, ...]] = {
    "core": ("sgl-core",),
    "cuda": ("sgl-core", "sgl-cuda"),
    "ascend": ("sgl-core", "sgl-ascend"),
}


@pytest.fixture(scope="session")
def session_dir() -> Iterator[Path]:
    sessions = cache_root() / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    remove_stale_sessions(sessions)
    path = Path(tempfile.mkdtemp(prefix="s-", dir=sessions))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def built_wheels(session_dir: Path) -> dict[str, Path]:
    """``{distribution: wheel}`` built from the working tree this session."""
    return build_wheels(session_dir / "wheels")


@pytest.fixture(scope="session")
def torch_dir() -> Path:
    return shared_torch(cache_root())


@pytest.fixture(scope="session")
def triton_dir() -> Path:
    return shared_triton(cache_root())


class EnvFactory:
    """Creates each named environment once per session, on first use."""

    def __init__(
        self,
        request: pytest.FixtureRequest,
        session_dir: Path,
        wheels: dict[str, Path],
    ) -> None:
        self._request = request
        self._dir = session_dir / "envs"
        self._wheels = wheels
        self._envs: dict[str, IsolatedEnv] = {}

    def __call__(self, name: str) -> IsolatedEnv:
        if name not in self._envs:
            dists = ENV_DISTS[name]
            shared: list[Path] = [self._request.getfixturevalue("torch_dir")]
            if "sgl-cuda" in dists:
                shared.append(self._request.getfixturevalue("triton_dir"))
            self._envs[name] = create_env(
                self._dir, name, [self._wheels[d] for d in dists], dists, shared
            )
        return self._envs[name]


@pytest.fixture(scope="session")
def isolated_env(
    request: pytest.FixtureRequest, session_dir: Path, built_wheels: dict[str, Path]
) -> EnvFactory:
    """``isolated_env("core" | "cuda" | "ascend")``: a fresh venv from the built wheels."""
    return EnvFactory(request, session_dir, built_wheels)
