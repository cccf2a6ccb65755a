"""The README's usage example runs as written, its commands are the documented ones,
and the docs point only inside the repository."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import sgl_core

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    ROOT / "docs" / "design.md",
    *sorted((ROOT / "packages").glob("*/README.md")),
]


def _run_example() -> tuple[dict[str, object], str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    namespace: dict[str, object] = {"__name__": "readme_example"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], "README.md", "exec"), namespace)
    return namespace, printed.getvalue()


@pytest.fixture(scope="module")
def example() -> Iterator[tuple[dict[str, object], str]]:
    """The example run once on the torch backend: (its namespace, what it printed)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGL_BACKEND", "torch")
        sgl_core.clear_backend_cache()
        try:
            yield _run_example()
        finally:
            sgl_core.clear_backend_cache()


def test_usage_example_runs_and_says_what_it_did(
    example: tuple[dict[str, object], str],
) -> None:
    namespace, printed = example
    assert namespace["out"] is not None
    backend = sgl_core.get_backend("torch")
    layout = next(iter(backend.supported_pairs))
    # deterministic: the io backend is the documented default_io, not a frozenset pick
    assert namespace["io_backend"] is backend.default_io(layout)
    lines = printed.splitlines()
    assert lines[0].startswith(f"torch: {layout.value}/{backend.default_io(layout).value}: ")
    assert lines[0].endswith("identical: True")
    assert lines[1].endswith("as expected: True")


def test_readme_shows_what_the_example_prints(example: tuple[dict[str, object], str]) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for line in example[1].splitlines():
        assert line in text, f"README does not show the example's output line {line!r}"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = "python -m pip install hatch && python -m hatch run all"
    assert command in readme
    assert command in ci


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_point_only_inside_the_repository(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    assert "../" + "shared" not in text  # split: the literal would itself point outside
    assert "DESIGN.md" not in text  # the spec is docs/design.md
    assert "DESIGN §" not in text
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_readme_links_the_design_doc_and_license() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/design.md)" in text
    assert "](LICENSE)" in text
    assert "python -m pip install ./packages/core ./packages/cuda" in text  # the real install
