"""Import-only stand-in for ``torchvision`` (a test fixture of the sglang env).

SGLang's and transformers' modules import torchvision names at module level,
but nothing the sglang tests run uses them. The only torchvision wheel that
matches the pinned torch is a CUDA build, so the sglang env puts this package
on ``sys.path`` instead. Every ``torchvision.*`` submodule imports; every name
in it is a placeholder that raises ``RuntimeError`` when called, so a test that
actually reached torchvision would fail loudly rather than pass on a fake.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+import-only-stub"


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(qualname: str) -> Any:
    def _refuse(*_args: object, **_kwargs: object) -> Any:
        raise RuntimeError(f"{qualname} is part of the import-only torchvision stub")

    return _PlaceholderMeta(qualname, (), {"__new__": _refuse, "__call__": _refuse})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> Any:
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.append(_StubFinder())
sys.modules[__name__].__class__ = _StubModule
