"""Public names report public paths; the SGLang device-pool adapter has a public import.

Every class and function in the ``__all__`` of every public module (no
``_`` in its dotted path) of sgl_core, sgl_cuda and sgl_ascend reports a public
``__module__`` that exports it, pickles by that path, and (classes) still
resolves its annotations there (issue 28: ``sgl_core.kv.protocols._protocols.MoEMethod``).
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import types
import typing
from collections.abc import Iterator

import pytest
import torch

import sgl_core
import sgl_core.backend


def public_modules(name: str) -> Iterator[str]:
    """``name`` and every public module below it (private packages are not entered)."""
    yield name
    module = importlib.import_module(name)
    for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
        if not info.name.startswith("_"):
            yield from public_modules(f"{name}.{info.name}")


def installed(*packages: str) -> list[str]:
    found = []
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError:  # a device package this environment does not have
            continue
        found.append(package)
    return found


MODULES = [m for p in installed("sgl_core", "sgl_cuda", "sgl_ascend") for m in public_modules(p)]


def exported(module_name: str) -> list[tuple[str, object]]:
    module = importlib.import_module(module_name)
    return [
        (name, getattr(module, name))
        for name in module.__all__
        if isinstance(getattr(module, name), (type, types.FunctionType))
    ]


def test_every_package_is_walked() -> None:
    assert {"sgl_core", "sgl_core.backend", "sgl_core.l3", "sgl_core.testing"} <= set(MODULES)
    for device in installed("sgl_cuda", "sgl_ascend"):
        assert device in MODULES
    assert all(exported(m) for m in ("sgl_core", "sgl_core.backend", "sgl_core.l3"))


@pytest.mark.parametrize("module_name", MODULES)
def test_every_exported_name_reports_a_public_path(module_name: str) -> None:
    wrong = []
    for name, obj in exported(module_name):
        reported: str = obj.__module__  # type: ignore[attr-defined]
        if any(part.startswith("_") for part in reported.split(".")):
            wrong.append(f"{name} reports {reported}")
            continue
        home = importlib.import_module(reported)
        assert name in home.__all__, f"{name} reports {reported}, which does not export it"
        assert getattr(home, obj.__qualname__) is obj  # type: ignore[attr-defined]
        assert pickle.loads(pickle.dumps(obj)) is obj, name
        if inspect.isclass(obj):
            typing.get_type_hints(obj)  # its annotations resolve from the reported module
    assert not wrong, f"{module_name}: " + "; ".join(wrong)


def test_instances_of_published_classes_pickle() -> None:
    """Instances pickle by the public path of their class (enums, dataclasses, errors)."""
    layout = pickle.loads(pickle.dumps(sgl_core.HostLayout.PAGE_FIRST))
    assert layout is sgl_core.HostLayout.PAGE_FIRST
    shape = sgl_core.backend.MLAShape(
        layer_num=2, kv_lora_rank=16, qk_rope_head_dim=8, dtype=torch.bfloat16
    )
    assert pickle.loads(pickle.dumps(shape)) == shape
    assert b"sgl_core._" not in pickle.dumps(shape)
    err = pickle.loads(pickle.dumps(sgl_core.l3.PageStoreError("x")))
    assert type(err) is sgl_core.l3.PageStoreError


PROTOCOLS = [
    "Backend",
    "MoEMethod",
    "MLADevicePool",
    "MLAHostPool",
    "MoEExperts",
    "MHADevicePool",
    "MHAHostPool",
    "IndexerCache",
    "KVRows",
]


@pytest.mark.parametrize("name", PROTOCOLS)
def test_protocols_report_the_public_module(name: str) -> None:
    cls = getattr(sgl_core, name)
    assert cls.__module__ == "sgl_core"
    assert repr(cls) == f"<class 'sgl_core.{name}'>"
    assert pickle.loads(pickle.dumps(cls)) is cls  # the public path resolves
    typing.get_type_hints(cls)  # its annotations still resolve from that module


def test_sglang_device_pool_adapter_is_public() -> None:
    from sgl_core.integrations import sglang

    assert "as_device_pool" in sglang.__all__
    assert callable(sglang.as_device_pool)


def test_sglang_doc_imports_only_public_modules() -> None:
    from pathlib import Path

    doc = Path(__file__).resolve().parents[3] / "docs" / "sglang.md"
    if not doc.exists():  # an installed wheel's tests, without the repository
        pytest.skip("docs/sglang.md is not here")
    assert "sgl_core._" not in doc.read_text(encoding="utf-8")


def test_user_docs_import_only_public_modules() -> None:
    """Code in the READMEs and docs/sglang.md imports public modules only."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    docs = [root / "README.md", root / "docs" / "sglang.md", *root.glob("packages/*/README.md")]
    docs = [d for d in docs if d.exists()]
    if not docs:
        pytest.skip("the repository's docs are not here")
    private = re.compile(r"(from|import)\s+sgl_(core|cuda|ascend)(\.\w+)*\._\w+")
    found = [
        f"{d.name}: {m.group(0)}" for d in docs for m in private.finditer(d.read_text("utf-8"))
    ]
    assert not found, found
