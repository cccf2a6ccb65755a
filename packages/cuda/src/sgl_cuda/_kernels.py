"""Where ``sgl_cuda``'s Triton transfer kernels come from, and whether they are interpreted.

Triton decides between compiling and interpreting (``TRITON_INTERPRET=1``)
when the kernels are defined, so the kernel module is imported on first use
and these helpers read or set that choice before it is made.

The interpreter runs a kernel by patching module state of ``triton.language``
for the duration of the launch, so two threads launching at once corrupt each
other's run: every interpreted launch holds ``interpreter_launch``'s lock.
Compiled GPU launches are thread-safe and take no lock. ``StreamFence``: the
point after the transfers a pool queued, which its movers record.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from types import ModuleType

import torch

from sgl_core.errors import BackendUnavailableError

__all__ = [
    "StreamFence",
    "interpreter_active",
    "interpreter_launch",
    "kernels",
    "start_interpreter",
]

_triton_module: ModuleType | None = None
_lock = threading.Lock()


def kernels() -> ModuleType:
    """Import the Triton module on first use, so ``import sgl_cuda`` stays light."""
    global _triton_module
    if _triton_module is None:
        from sgl_cuda._triton import kvcacheio as module

        _triton_module = module
    return _triton_module


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in {"1", "true", "on", "yes"}


def start_interpreter() -> str:
    """Make this process run the kernels in Triton's interpreter; says how it was turned on
    (``BackendUnavailableError`` once they were built for a GPU: too late)."""
    # Read, never imported here: importing would build the kernels.
    kernels = sys.modules.get("sgl_cuda._triton.kvcacheio")
    if kernels is not None and not getattr(kernels, "INTERPRETED", False):
        raise BackendUnavailableError(
            "no CUDA device here, and its Triton kernels were already built "
            "for a GPU in this process; run it in a new process"
        )
    if _env_interpret():
        return "TRITON_INTERPRET=1 was set"
    os.environ["TRITON_INTERPRET"] = "1"  # read by Triton when the kernels are defined
    return "this run set TRITON_INTERPRET=1"


def interpreter_active() -> bool:
    """True when the transfer kernels run in Triton's interpreter (CPU tensors): when
    ``TRITON_INTERPRET=1`` was set before the first transfer (or this call)."""
    if _triton_module is None and not _env_interpret():
        return False
    return bool(kernels().INTERPRETED)


def interpreter_launch(interpreted: bool) -> contextlib.AbstractContextManager[object]:
    """The lock every interpreted launch holds; a no-op context for compiled kernels."""
    return _lock if interpreted else contextlib.nullcontext()


class StreamFence:
    """The point after the last transfer a pool queued, per CUDA stream.

    Thread-safe: every caller of :meth:`synchronize` waits for every transfer
    recorded before it was called, also while another thread is already
    waiting for the same events (an L3 reader must never see a page whose
    device-to-host copy is still running).
    """

    def __init__(self) -> None:
        self._pending: dict[int, torch.cuda.Event] = {}
        self._lock = threading.Lock()

    def record(self, device: torch.device) -> None:
        """Remember the point on the current stream after the transfer just queued."""
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            event = stream.record_event()
            with self._lock:
                # One event per stream: a write-back stream and a load stream both count.
                self._pending[stream.cuda_stream] = event

    def synchronize(self) -> None:
        """Wait until every recorded transfer, on any stream, has finished."""
        with self._lock:
            pending = list(self._pending.items())
        for _, event in pending:  # outside the lock: recording must not wait for this
            event.synchronize()
        with self._lock:  # forget only what was waited for, not an event recorded since
            for key, event in pending:
                if self._pending.get(key) is event:
                    del self._pending[key]
