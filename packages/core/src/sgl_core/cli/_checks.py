"""Argument checks that run before any benchmark work: a bad value exits 2 with one line.

Each check raises :class:`UsageError`; ``main`` prints its message as
``sgl-bench <command>: error: <message>`` and returns 2. Nothing here
allocates pools, writes files or imports a device package.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import NoReturn

import torch

from sgl_core.kv._memory import available_host_bytes

__all__ = ["EXIT_STATUS", "CliParser", "UsageError", "check_args", "check_memory", "exit_status"]


def exit_status(verified: str) -> str:
    """The exit-status epilog of one command, naming what that command verifies."""
    return (
        f"exit status: 0 = every result was verified ({verified}), whether or not any "
        "performance goal printed at the end was met; 1 = a verification failed; 2 = bad "
        "usage or argument (one line on stderr, checked before any work starts)."
    )


EXIT_STATUS = exit_status("bit-exact round trips, checked MoE outputs")


# Leave this much host memory to the rest of the machine when sizing a run.
MEMORY_HEADROOM = 1 << 30


class CliParser(argparse.ArgumentParser):
    """Reports a usage error in one line (no usage block) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class UsageError(Exception):
    """A command-line value that cannot work; reported in one line, exit status 2."""


def check_args(
    args: argparse.Namespace, positive: tuple[str, ...], nonneg: tuple[str, ...] = ()
) -> torch.device | None:
    """The checks commands share: options named (as attributes) > 0 or >= 0, then
    ``--device``, ``--json`` and ``--plot`` where the command has them; returns the device."""
    for name in positive + nonneg:
        value, zero_ok = getattr(args, name), name in nonneg
        if value is None:  # the option's default
            continue
        if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
            bound = ">= 0" if zero_ok else "> 0"
            raise UsageError(f"--{name.replace('_', '-')} must be {bound}, got {value}")
    # output paths can be written (checked before the run, so a long benchmark never ends
    # in a failed write); creates nothing: the probe file is anonymous and closed at once
    for option, path in ((f"--{o}", getattr(args, o, None)) for o in ("json", "plot")):
        if path is None:
            continue
        target = Path(path)
        if target.is_dir():
            raise UsageError(f"{option} {path!r} is a directory; give a file path")
        parent = target.parent
        if not parent.is_dir():
            raise UsageError(f"{option} {path!r}: directory {str(parent)!r} does not exist")
        if target.exists():
            writable = os.access(target, os.W_OK)
        else:
            writable = os.access(parent, os.W_OK | os.X_OK)
            if writable:
                try:
                    with tempfile.TemporaryFile(dir=parent):
                        pass
                except OSError:
                    writable = False
        if not writable:
            raise UsageError(f"{option} {path!r}: cannot write there (permission or read-only)")
    if getattr(args, "plot", None):  # matplotlib comes with the bench extra
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(
                "--plot needs matplotlib: install sgl-core[bench] "
                "(pip install './packages/core[bench]')"
            ) from None
    return check_device(getattr(args, "device", None))


def check_device(spec: str | None) -> torch.device | None:
    """Parse ``--device``; reject names torch does not know, ``meta`` and absent devices."""
    if spec is None:
        return None
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(
            f"--device {spec!r} is not a torch device (examples: cpu, cuda, cuda:1)"
        ) from None
    if device.type == "meta":
        raise UsageError("--device meta holds no data; the benchmark needs real memory (cpu, cuda)")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"--device {spec!r}: no CUDA device is available here")
        if device.index is not None and device.index >= count:
            raise UsageError(f"--device {spec!r}: this machine has {count} CUDA device(s)")
    elif device.type != "cpu":
        module = getattr(torch, device.type, None)
        is_available = getattr(module, "is_available", None)
        if not callable(is_available) or not is_available():
            raise UsageError(f"--device {spec!r}: no {device.type} device is available here")
    return device


def check_memory(
    option: str, needed_host: int, what: str, device: torch.device | None = None
) -> None:
    """``needed_host`` bytes fit in the available memory, less a headroom.

    With a CUDA ``device`` the bytes are checked against its free memory instead.
    """
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if needed_host > free:
            raise UsageError(
                f"{option}: {what} needs about {needed_host / 1e9:.1f} GB on {device}, which "
                f"has {free / 1e9:.1f} GB free; choose a smaller value"
            )
        return
    available = available_host_bytes()
    if available is None:
        return
    if needed_host > available - MEMORY_HEADROOM:
        raise UsageError(
            f"{option}: {what} needs about {needed_host / 1e9:.1f} GB of host memory, and "
            f"{available / 1e9:.1f} GB is available (1 GiB kept free); choose a smaller value"
        )
