"""``StreamFence``: the point after the last transfer a host pool queued, per CUDA stream."""

from __future__ import annotations

import threading

import torch

__all__ = ["StreamFence"]


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
