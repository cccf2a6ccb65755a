"""vLLM 0.33's own offloading classes driving our spec (sgl_core.integrations.vllm).

These tests need ``vllm`` (0.33.0, installed without its dependencies by
``hatch run core:vllm``, in the sgl-core-only env). Elsewhere (the default env,
which has no vllm) this directory is skipped at collection. Where
``SGLTEST_REQUIRE_VLLM=1`` (set by that script) a missing vllm is an error, not a skip.

The directory is not named ``vllm``: with ``tests/`` on ``sys.path`` it would
shadow the real package as a namespace package.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

_HAVE_VLLM = importlib.util.find_spec("vllm") is not None

if not _HAVE_VLLM:
    if os.environ.get("SGLTEST_REQUIRE_VLLM") == "1":
        raise pytest.UsageError(
            "SGLTEST_REQUIRE_VLLM=1 but vllm is not installed: run `hatch run core:vllm`, "
            "which installs tests/with_vllm/requirements-nodeps.txt"
        )
    collect_ignore_glob = ["test_*.py"]
