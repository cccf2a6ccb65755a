"""Serializes Triton launches while kernels run in Triton's interpreter.

The interpreter (``TRITON_INTERPRET=1``) runs a kernel by patching module
state of ``triton.language`` for the duration of the launch, so two threads
launching at once corrupt each other's run. Compiled GPU launches are
thread-safe and take no lock.
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["interpreter_launch"]

_lock = threading.Lock()


def interpreter_launch(interpreted: bool) -> contextlib.AbstractContextManager[object]:
    """The lock every interpreted launch holds; a no-op context for compiled kernels."""
    return _lock if interpreted else contextlib.nullcontext()
