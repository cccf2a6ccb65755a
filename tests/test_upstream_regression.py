"""Regression for the upstream bug class (sglang #36640 / revert #36747), from the wheels.

A shared sgl_core path (MoE combine; host MLA backup through the protocol) is
called with one device package's real objects, in an environment that has
only that device package and where every import of the other device stack
raises. See tests/_regression_probe.py for what each mode runs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _sgl_envs import IsolatedEnv
from _sgl_support import TESTS

EnvGetter = Callable[[str], IsolatedEnv]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cuda", "ascend", "core"])
def test_shared_paths_work_with_other_device_unimportable(
    isolated_env: EnvGetter, mode: str
) -> None:
    env = isolated_env(mode)
    extra = {"TRITON_INTERPRET": "1"} if mode == "cuda" else {}
    result = env.python_cmd(
        str(TESTS / "_regression_probe.py"), mode, extra_env=extra, timeout=300, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"REGRESSION-OK {mode}" in result.stdout, output
    # Nothing on these paths even tried to import the other device stack.
    assert "blocked import attempts: []" in result.stdout, output
