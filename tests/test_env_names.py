"""Our environment variables stay clear of SGLang's prefix rule: SGLang 0.5.23 rewrites
every ``SGL_*`` variable to ``SGLANG_*`` with a deprecation warning at import
(``sglang.srt.environ._handle_deprecated_envs``). The only ``SGL_`` names left are the
user-facing ``SGL_BACKEND`` and ``SGL_CUDA_DIRECT_COPY`` (kept for compatibility)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = {"SGL_BACKEND", "SGL_CUDA_DIRECT_COPY"}


def _sources() -> list[Path]:
    files = [ROOT / "hatch.toml", ROOT / ".ci" / "run"]
    for pattern in ("packages/*/src/**/*.py", "packages/*/tests/**/*.py", "tests/**/*.py"):
        files += ROOT.glob(pattern)
    return [f for f in files if f.is_file() and f.name != Path(__file__).name]


def test_no_new_sgl_prefixed_environment_variables() -> None:
    found: dict[str, str] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        # Python: quoted names (os.environ keys, docs); hatch.toml and shell: every name
        quoted = path.suffix == ".py"
        pattern = r"[\"'`$](SGL_[A-Z][A-Z0-9_]*)" if quoted else r"\b(SGL_[A-Z][A-Z0-9_]*)"
        for name in re.findall(pattern, text):
            found.setdefault(name, str(path.relative_to(ROOT)))
    assert {n: p for n, p in found.items() if n not in KEPT} == {}
