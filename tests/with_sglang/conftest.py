"""SGLang's real cache controller and storage factory driving our pools and stores.

These tests need ``sglang`` (0.5.23, installed without its dependencies by
``hatch run sglang:test``). Elsewhere (the default env, which has no sglang)
this directory is skipped at collection. Where ``SGLTEST_REQUIRE_SGLANG=1`` (set
by the sglang env) a missing sglang is an error, not a skip.

The directory is not named ``sglang``: with ``tests/`` on ``sys.path`` (the
root conftest's directory) it would shadow the real package as a namespace
package.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HAVE_SGLANG = importlib.util.find_spec("sglang") is not None

if not _HAVE_SGLANG:
    if os.environ.get("SGLTEST_REQUIRE_SGLANG") == "1":
        raise pytest.UsageError(
            "SGLTEST_REQUIRE_SGLANG=1 but sglang is not installed: run `hatch run sglang:test`, "
            "which installs tests/with_sglang/requirements-nodeps.txt"
        )
    collect_ignore_glob = ["test_*.py"]
else:
    # The import-only torchvision stub goes last: a real torchvision wins.
    if importlib.util.find_spec("torchvision") is None:
        sys.path.append(str(Path(__file__).parent / "_stubs"))
    # The cuda backend's Triton kernels run on CPU tensors only in the interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def published() -> Iterator[None]:
    """Restore the process's published server args (SGLang's RuntimeContext) after the test."""
    from sglang.srt.runtime_context import get_context

    ctx = get_context()
    saved = (ctx._server_args, ctx._config_bags, ctx.parallel._config)
    try:
        yield
    finally:
        ctx._server_args, ctx._config_bags = saved[0], saved[1]
        ctx.parallel._config = saved[2]
