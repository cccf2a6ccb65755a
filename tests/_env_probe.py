"""Run inside an isolated environment (``python -I _env_probe.py OUT.json``).

Reports, as JSON: which sgl / device-stack modules get loaded and when, the
result of every module import of every installed sgl package, backend
discovery under each ``SGL_BACKEND`` value, and what is installed. Assertions
live in tests/test_isolation_wheels.py; this script only observes. It uses the
standard library plus what the environment has installed.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import pkgutil
import sys
import traceback

WATCHED = (
    "sgl_core",
    "sgl_cuda",
    "sgl_ascend",
    "triton",
    "sgl_kernel",
    "torch_npu",
    "sgl_kernel_npu",
    "mooncake",
    "gguf",
)
SGL_PACKAGES = ("sgl_core", "sgl_cuda", "sgl_ascend")


def loaded() -> list[str]:
    roots = {name.split(".", 1)[0] for name in list(sys.modules)}
    return sorted(roots & set(WATCHED))


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def resolve(name: str | None) -> str:
    import sgl_core

    sgl_core.clear_backend_cache()
    try:
        backend = sgl_core.get_backend(name)
    except sgl_core.errors.BackendNotFoundError:
        return "error:BackendNotFoundError"
    except Exception as exc:
        return f"error:{describe(exc)}"
    return backend.name


def main(out_path: str) -> None:
    report: dict[str, object] = {"executable": sys.executable, "prefix": sys.prefix}
    os.environ.pop("SGL_BACKEND", None)
    report["loaded_at_start"] = loaded()

    import sgl_core

    report["loaded_after_import_sgl_core"] = loaded()
    report["entry_points"] = sorted(
        f"{ep.name}={ep.value}" for ep in md.entry_points(group="sgl.backends")
    )
    report["available_backends"] = sgl_core.available_backends()
    report["loaded_after_listing"] = loaded()
    report["auto_backend"] = resolve(None)
    report["loaded_after_auto"] = loaded()

    by_env: dict[str, str] = {}
    explicit: dict[str, str] = {}
    for name in ("torch", "cuda", "ascend", "no-such-backend"):
        os.environ["SGL_BACKEND"] = name
        by_env[name] = resolve(None)
        os.environ.pop("SGL_BACKEND")
        explicit[name] = resolve(name)
    sgl_core.clear_backend_cache()
    report["sgl_backend_env"] = by_env
    report["explicit"] = explicit

    modules: dict[str, str | None] = {}
    for package in SGL_PACKAGES:
        if importlib.util.find_spec(package) is None:
            continue
        root = importlib.import_module(package)
        modules[package] = None
        errors: list[str] = []
        for info in pkgutil.walk_packages(
            root.__path__, prefix=f"{package}.", onerror=errors.append
        ):
            try:
                importlib.import_module(info.name)
            except BaseException as exc:  # report SystemExit etc. too
                modules[info.name] = describe(exc) + "\n" + traceback.format_exc(limit=6)
            else:
                modules[info.name] = None
        for name in errors:
            modules.setdefault(name, "walk_packages could not import this package")
    report["modules"] = modules
    report["loaded_after_all_imports"] = loaded()
    report["module_files"] = {
        name: getattr(sys.modules.get(name), "__file__", None) for name in SGL_PACKAGES
    }

    report["find_spec"] = {
        name: importlib.util.find_spec(name) is not None
        for name in ("triton", "torch_npu", "sgl_kernel", "sgl_kernel_npu", *SGL_PACKAGES)
    }
    report["distributions"] = sorted(
        {(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()}
    )
    versions: dict[str, str | None] = {}
    for dist in ("torch", "numpy", "triton", "torch-npu", "sgl-core", "sgl-cuda", "sgl-ascend"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    report["versions"] = versions
    import torch

    report["torch_version"] = torch.__version__
    report["torch_file"] = torch.__file__
    report["cuda_available"] = bool(torch.cuda.is_available())
    with open(out_path, "w") as handle:
        json.dump(report, handle, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1])
