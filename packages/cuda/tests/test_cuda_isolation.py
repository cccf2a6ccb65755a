"""sgl_cuda never imports Ascend packages, and ``import sgl_cuda`` stays light."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = ("torch_npu", "sgl_ascend", "sgl_kernel_npu")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked import of {name}")
            return None

    sys.meta_path.insert(0, Block())

    import sgl_cuda
    light = sorted(m for m in sys.modules if m.startswith("sgl_cuda.quantization")
                   or m == "triton" or m.startswith("triton."))
    assert not light, f"import sgl_cuda pulled in {light}"

    failures = []
    for info in pkgutil.walk_packages(sgl_cuda.__path__, "sgl_cuda."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            if any(b in str(exc) for b in BLOCKED):
                failures.append(f"{info.name}: {exc}")
            else:
                raise
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not failures, failures
    assert not leaked, leaked
    print("ok", len([m for m in sys.modules if m.startswith("sgl_cuda")]))
    """
)


def test_no_ascend_imports() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], check=False, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok")
