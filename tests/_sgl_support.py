"""Shared helpers of the cross-package tests: paths, the cache root, skip policy.

Kept free of pytest fixtures so that test modules can import it directly.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PYPROJECT = REPO / "pyproject.toml"

# distribution name -> (project dir, import package)
PACKAGES: dict[str, tuple[Path, str]] = {
    "sgl-core": (REPO / "packages" / "core", "sgl_core"),
    "sgl-cuda": (REPO / "packages" / "cuda", "sgl_cuda"),
    "sgl-ascend": (REPO / "packages" / "ascend", "sgl_ascend"),
}

TORCH_VERSION = "2.13.0"
TRITON_VERSION = "3.7.1"

# Top-level modules of each device stack (docs/design.md section 2).
CUDA_STACK = ("sgl_cuda", "triton", "sgl_kernel")
ASCEND_STACK = ("sgl_ascend", "torch_npu", "sgl_kernel_npu")


def in_ci() -> bool:
    """True under CI (``CI`` set to anything but empty/0/false): skips become failures."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip a test whose precondition is genuinely missing here; in CI, fail instead."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def cache_root() -> Path:
    """``$SGLTEST_CACHE``, else ``$XDG_CACHE_HOME/sgl-tests``, else ``~/.cache/sgl-tests``."""
    explicit = os.environ.get("SGLTEST_CACHE")
    if explicit:
        root = Path(explicit)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "sgl-tests"
    root.mkdir(parents=True, exist_ok=True)
    return root


def python_tag() -> str:
    return f"py{sys.version_info.major}{sys.version_info.minor}"
