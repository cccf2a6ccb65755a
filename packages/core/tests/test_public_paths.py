"""Public names report public paths; the SGLang device-pool adapter has a public import."""

from __future__ import annotations

import pickle
import typing

import pytest

import sgl_core

PROTOCOLS = [
    "Backend",
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
