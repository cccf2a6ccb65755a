"""The package READMEs (each wheel's PyPI page) say what the code does now.

Issue 28: sgl-core's description covered MLA only while the code builds MHA/GQA
and DSA pools too. The host layouts a README names are exactly the ones its
backend builds (``supported_pairs`` and ``supported_mha_pairs``), so a layout
added or dropped in the code fails here until the page says so.
"""

from __future__ import annotations

import re

import pytest
from _sgl_support import REPO

import sgl_core
from sgl_core import HostLayout

LAYOUT_NAMES = sorted((m.value for m in HostLayout), key=len, reverse=True)
LAYOUT = re.compile(r"\b(" + "|".join(LAYOUT_NAMES) + r")\b")


def readme(package: str) -> str:
    return (REPO / "packages" / package / "README.md").read_text(encoding="utf-8")


def test_core_readme_covers_every_attention_kind() -> None:
    text = readme("core")
    for kind in ("MLA", "MHA/GQA", "DSA", "create_device_pool", "create_mha_device_pool"):
        assert kind in text, kind


@pytest.mark.parametrize(
    ("package", "backend"), [("core", "torch"), ("cuda", "cuda"), ("ascend", "ascend")]
)
def test_readme_names_exactly_the_layouts_its_backend_builds(package: str, backend: str) -> None:
    if backend not in sgl_core.available_backends():
        pytest.skip(f"backend {backend!r} is not installed here")
    built = sgl_core.get_backend(backend)
    layouts = {layout.value for layout in built.supported_pairs}
    layouts |= {layout.value for layout in built.supported_mha_pairs}
    named = set(LAYOUT.findall(readme(package)))
    assert named == layouts, f"{package}/README.md names {sorted(named)}, builds {sorted(layouts)}"
