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
    assert "python -m pip install -c constraints.txt ./packages/core ./packages/cuda" in text


def _pairs(cell: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+/[a-z_]+)`", cell))


def _as_pairs(mapping: object) -> set[str]:
    assert isinstance(mapping, dict)
    return {f"{layout.value}/{io.value}" for layout, ios in mapping.items() for io in ios}


def test_readme_capability_table_matches_the_backends() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\s*\| `(\w+)` \| (.*?) \| (.*?) \|\s*$", text, re.M)
    table = {name: (mla, mha) for name, mla, mha in rows}
    assert set(table) == {"torch", "cuda", "ascend"}, "README's capability table lost a backend"
    for name, (mla, mha) in table.items():
        try:
            backend = sgl_core.get_backend(name)
        except sgl_core.errors.BackendUnavailableError:
            continue  # its package is not installed in this environment
        assert _pairs(mla) == _as_pairs(backend.supported_pairs), name
        assert _pairs(mha) == _as_pairs(backend.supported_mha_pairs), name
    assert "report empty" not in text  # the old, wrong claim


#: ``sgl-bench hicache``'s third line: the streaming copy's status on this machine
STREAM_LINE = "streaming copy (CPU loads and backups): "


def _shape(line: str) -> str:
    """A line's structure: numbers masked, blank runs as one, a goal line up to its verdict."""
    line = line.rstrip()
    if line.lstrip().startswith("goal "):
        line = line.split(": ")[0]  # the verdict and the worst case depend on the run
    if line.startswith(STREAM_LINE):
        return STREAM_LINE  # which kernel (or why none) depends on the machine
    indent = line[: len(line) - len(line.lstrip())]
    line = re.sub(r"\d+(?:\.\d+)?\??", "#", line)  # a ratio's "?" mark depends on the run
    return indent + " ".join(line.split())  # widths follow numbers


def test_readme_sample_output_has_the_structure_the_cli_prints_now(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sgl_core.cli.main import main

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("```\nsgl-bench hicache: ") + 4
    sample = text[start : text.index("```", start)].strip("\n").splitlines()
    tiny = ["--layers", "3", "--pages", "4", "--repeats", "1", "--warmup", "0"]
    monkeypatch.setenv("SGL_BACKEND", "torch")  # the README's machine: the embedded default
    sgl_core.clear_backend_cache()
    try:
        assert main(["hicache", *tiny]) == 0
    finally:
        sgl_core.clear_backend_cache()
    printed = capsys.readouterr().out.strip("\n").splitlines()
    printed = [x for x in printed if not x.startswith("warning: the machine was busy")]
    # what the copy calibration chose, and how the streaming team's calls went, depend on the
    # machine and the call sizes (the tiny run here moves too little to measure): their lines
    # are left out on both sides
    chosen = ("  copy calibration: ", "  streaming team: ")
    sample = [x for x in sample if not x.startswith(chosen)]
    printed = [x for x in printed if not x.startswith(chosen)]
    assert [_shape(x) for x in sample] == [_shape(x) for x in printed]


def test_readme_installs_use_the_tested_pins() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    hatch = (ROOT / "hatch.toml").read_text(encoding="utf-8")
    for name in ("torch", "triton"):
        assert f'"{name}=={pins[name]}"' in hatch, f"constraints.txt vs hatch.toml: {name}"
    installs = re.findall(r"^python -m pip install (.*\./packages/.*)$", text, re.M)
    assert installs
    for line in installs:
        assert line.startswith("-c constraints.txt "), line
