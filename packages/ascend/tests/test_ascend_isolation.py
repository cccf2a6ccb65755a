"""sgl_ascend imports nothing CUDA-only: every module imports with those made unimportable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("triton", "sgl_cuda", "sgl_kernel", "torch_npu")

_SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = {blocked!r}

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    import sgl_ascend
    names = [m.name for m in pkgutil.walk_packages(sgl_ascend.__path__, "sgl_ascend.")]
    for name in names:
        importlib.import_module(name)
    import sgl_core
    assert sgl_core.get_backend("ascend") is sgl_ascend.backend
    assert sgl_ascend.backend.is_available() is False
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print(len(names), "modules")
    """
).format(blocked=BLOCKED)


def test_every_module_imports_without_cuda_stack() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "modules" in done.stdout
    count = int(done.stdout.split()[0])
    assert count >= 6  # _backend, _device_pool, _host_pool, _moe, _npu, _transfer
