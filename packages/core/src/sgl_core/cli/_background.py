"""``sgl-bench hicache --background-load N``: N busy processes beside the measurement.

Each is a Python loop that spins one core, as a serving host's other
processes do (scheduler, tokenizer, other ranks). They are bounded three
ways: the context manager kills them on exit (also on Ctrl-C and errors),
each exits by itself after ``max_s`` seconds, and each exits when its parent
is gone (checked every few ms).
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import TracebackType

__all__ = ["BUSY_CODE", "BusyProcesses"]

BUSY_CODE = """
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
parent = int(sys.argv[2])
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(20000):
        pass
"""


class BusyProcesses:
    """``with BusyProcesses(n):`` runs ``n`` bounded busy processes for the block."""

    def __init__(self, count: int, max_s: float = 3600.0) -> None:
        self.count = count
        self.max_s = max_s
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyProcesses:
        try:
            for _ in range(self.count):
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", BUSY_CODE, str(self.max_s), str(os.getpid())],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,  # Ctrl-C reaches us; we stop them
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill and reap every process started (idempotent)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs.clear()
