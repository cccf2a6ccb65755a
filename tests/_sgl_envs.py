"""Fresh virtual environments built from the three wheels (issue 6, "isolation").

Layout under the cache root (``$SGLTEST_CACHE`` or ``~/.cache/sgl-tests``):

* ``shared/torch-<ver>-<py>-<hash>/``: ``pip install --target`` of the pinned CPU
  torch, numpy, pytest and hypothesis (what every environment needs: sgl-core's
  requirements plus its ``testing`` extra). Built once, reused by every session.
  It must never contain triton or torch-npu (checked after the build).
* ``shared/triton-<ver>-<py>/``: ``pip install --target --no-deps triton==<ver>``,
  given to the core+cuda environment only.
* ``sessions/<tmp>/``: this session's wheels and venvs, deleted at the end.

Each venv is created without pip (``python -m venv --without-pip``); a
``_sgl_shared.pth`` file in its site-packages puts the shared directories on
``sys.path``, so pip (run as ``pip --python <venv>``), ``importlib.metadata``
and ``pip check`` all see torch/numpy (and triton in the cuda env) as installed
distributions with their metadata. The wheels are then installed with
``--no-index``, ``-c constraints.txt`` (as the README's install lines) and normal
dependency resolution: the install succeeds only if
every ``Requires-Dist`` is already satisfied, and pip must install nothing but
the sgl wheels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from _sgl_support import PACKAGES, REPO, TORCH_VERSION, TRITON_VERSION, python_tag, skip_or_fail

BASE_REQUIREMENTS = (f"torch=={TORCH_VERSION}", "numpy>=1.24", "pytest>=8", "hypothesis>=6.100")
TRITON_REQUIREMENT = f"triton=={TRITON_VERSION}"
_MARKER = ".sgl-complete"
# Environment variables a subprocess must not inherit: they would leak the
# test runner's interpreter, packages or backend choice into the fresh env, or
# redirect pip's installs. Other PIP_* settings (certificates, index, timeout,
# cache) are machine configuration and are kept.
_SCRUB_PREFIXES = ("PYTHON", "VIRTUAL_ENV", "CONDA", "SGL_", "TRITON_", "UV_")
_SCRUB_PIP = {
    "PIP_TARGET",
    "PIP_PREFIX",
    "PIP_ROOT",
    "PIP_USER",
    "PIP_PYTHON",
    "PIP_REQUIRE_VIRTUALENV",
    "PIP_NO_DEPS",
    "PIP_EDITABLE",
    "PIP_UPGRADE",
    "PIP_FORCE_REINSTALL",
    "PIP_IGNORE_INSTALLED",
}


class CommandError(RuntimeError):
    def __init__(self, cmd: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.result = result
        tail = (result.stdout + result.stderr)[-6000:]
        super().__init__(f"command failed ({result.returncode}): {' '.join(cmd)}\n{tail}")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_SCRUB_PREFIXES) and k not in _SCRUB_PIP
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    env.update(extra or {})
    return env


def run(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(cmd),
        env=dict(env) if env is not None else clean_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise CommandError(cmd, result)
    return result


def pip(*args: str, python: Path | None = None) -> list[str]:
    """A pip command run by the test runner's pip, targeting ``python`` if given."""
    target = ["--python", str(python)] if python is not None else []
    return [sys.executable, "-m", "pip", *target, *args]


# --- shared, cached installs ---------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (pytest-xdist workers, parallel sessions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _requirements_key(requirements: Sequence[str]) -> str:
    text = "\n".join([*requirements, python_tag(), platform.machine(), sys.platform])
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def cached_target(
    root: Path, name: str, requirements: Sequence[str], *, no_deps: bool = False
) -> Path:
    """``pip install --target`` of ``requirements`` into ``root/shared/name``, once."""
    target = root / "shared" / name
    with _locked(target.with_name(target.name + ".lock")):
        if (target / _MARKER).is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=target.parent))
        cmd = pip(
            "install",
            "--target",
            str(staging),
            "--no-warn-script-location",
            "--only-binary=:all:",
            *(["--no-deps"] if no_deps else []),
            *requirements,
        )
        try:
            run(cmd, env=clean_env(), timeout=1200)
        except CommandError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            skip_or_fail(
                f"cannot install {' '.join(requirements)} for the isolated environments "
                f"(no index or local wheel reachable?): {str(exc)[-1500:]}"
            )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        (target / _MARKER).write_text(json.dumps({"requirements": list(requirements)}))
        return target


def installed_distributions(path: Path) -> set[str]:
    """Normalized names of the ``*.dist-info`` directories directly under ``path``."""
    names = set()
    for info in path.glob("*.dist-info"):
        names.add(normalize(info.name[: -len(".dist-info")].rsplit("-", 1)[0]))
    return names


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def shared_torch(root: Path) -> Path:
    key = _requirements_key(BASE_REQUIREMENTS)
    target = cached_target(root, f"torch-{TORCH_VERSION}-{python_tag()}-{key}", BASE_REQUIREMENTS)
    found = installed_distributions(target)
    assert {"torch", "numpy"} <= found, found
    leaked = found & {"triton", "torch-npu", "sgl-core", "sgl-cuda", "sgl-ascend"}
    assert not leaked, f"the shared torch directory {target} must not hold {leaked}"
    return target


def shared_triton(root: Path) -> Path:
    target = cached_target(
        root, f"triton-{TRITON_VERSION}-{python_tag()}", [TRITON_REQUIREMENT], no_deps=True
    )
    assert installed_distributions(target) == {"triton"}, installed_distributions(target)
    return target


# --- wheels ----------------------------------------------------------------------------


def build_wheels(out: Path) -> dict[str, Path]:
    """Build the three wheels with pip; ``{distribution name: wheel path}``.

    Without build isolation when hatchling is importable (offline, fast);
    otherwise pip builds in an isolated env, fetching hatchling from the index.
    """
    out.mkdir(parents=True, exist_ok=True)
    no_isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    projects = [str(project) for project, _ in PACKAGES.values()]
    cmd = pip("wheel", "--no-deps", "--wheel-dir", str(out), *no_isolation, *projects)
    try:
        run(cmd, env=clean_env(), timeout=600)
    except CommandError as exc:
        skip_or_fail(f"cannot build the wheels: {str(exc)[-1500:]}")
    wheels: dict[str, Path] = {}
    for dist in PACKAGES:
        stem = dist.replace("-", "_")
        found = sorted(out.glob(f"{stem}-*.whl"))
        assert len(found) == 1, f"expected one wheel of {dist} in {out}, found {found}"
        wheels[dist] = found[0]
    return wheels


# --- environments ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IsolatedEnv:
    """A venv holding exactly ``dists`` (plus the shared torch and, maybe, triton)."""

    name: str
    root: Path
    dists: tuple[str, ...]
    shared: tuple[Path, ...]
    install_log: str
    seconds: float

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = clean_env(extra)
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        return env

    def python_cmd(
        self,
        *args: str,
        extra_env: Mapping[str, str] | None = None,
        timeout: float = 300,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run the venv's interpreter isolated (``-I``: no PYTHONPATH, no user site, no cwd)."""
        return run(
            [str(self.python), "-I", *args],
            env=self.env(extra_env),
            cwd=self.root,
            timeout=timeout,
            check=check,
        )

    def pip_cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(pip(*args, python=self.python), env=self.env(), timeout=600, check=check)


def create_env(
    root: Path, name: str, wheels: Sequence[Path], dists: Sequence[str], shared: Sequence[Path]
) -> IsolatedEnv:
    started = time.perf_counter()
    location = root / name
    venv.EnvBuilder(with_pip=False, clear=True, symlinks=os.name != "nt").create(location)
    python = location / "bin" / "python"
    purelib = run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        env=clean_env(),
    ).stdout.strip()
    (Path(purelib) / "_sgl_shared.pth").write_text("".join(f"{p}\n" for p in shared))
    # --no-index: every requirement of the wheels must already be satisfied by
    # what the env holds; nothing is downloaded or taken from a local index.
    # -c constraints.txt as the README's install lines: the tested pins must
    # agree with the wheels' requirements and with the torch/triton installed.
    constraints = ("-c", str(REPO / "constraints.txt"))
    result = run(
        pip(
            "install", "--no-index", "--no-compile", *constraints, *map(str, wheels), python=python
        ),
        env=clean_env(),
        timeout=600,
    )
    return IsolatedEnv(
        name=name,
        root=location,
        dists=tuple(dists),
        shared=tuple(shared),
        install_log=result.stdout + result.stderr,
        seconds=time.perf_counter() - started,
    )


def newly_installed(install_log: str) -> set[str]:
    """Distributions pip says it installed ("Installing collected packages: a, b")."""
    names: set[str] = set()
    for line in install_log.splitlines():
        if line.startswith("Installing collected packages:"):
            names |= {normalize(n.strip()) for n in line.split(":", 1)[1].split(",")}
    return names


def remove_stale_sessions(sessions: Path, older_than_s: float = 6 * 3600) -> None:
    """Sessions that crashed before cleaning up (venvs are ~1 MB each; wheels tiny)."""
    if not sessions.is_dir():
        return
    now = time.time()
    for entry in sessions.iterdir():
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime > older_than_s:
                shutil.rmtree(entry, ignore_errors=True)
