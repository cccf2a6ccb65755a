"""``device`` arguments of pool constructors: parsed and probed before any allocation."""

from __future__ import annotations

import torch

from sgl_core.errors import BackendUnavailableError, DeviceError, PoolSizeError
from sgl_core.kv._memory import available_host_bytes

__all__ = ["check_fits", "parse_device", "usable_device"]


def parse_device(device: object, *, argument: str = "device") -> torch.device | None:
    """``None``, or a ``str``/``torch.device`` naming a device with storage; else ``DeviceError``.

    Ints are rejected rather than read as a CUDA ordinal: write ``"cuda:0"``.
    """
    if device is None:
        return None
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise DeviceError(
                f"{argument}={device!r} is not a torch device string: {exc}"
            ) from None
    else:
        raise DeviceError(
            f"{argument} must be a str, torch.device or None, got {type(device).__name__} "
            f"{device!r} (write e.g. 'cuda:0')"
        )
    if parsed.type == "meta":
        raise DeviceError(
            f"{argument}={str(parsed)!r}: meta tensors have no storage for a KV cache"
        )
    return parsed


def usable_device(device: object, *, argument: str = "device") -> torch.device:
    """A parsed device (``None``: cpu) on which torch can allocate here."""
    parsed = parse_device(device, argument=argument) or torch.device("cpu")
    if parsed.type == "cpu":
        return parsed
    try:
        torch.empty(0, device=parsed)
    except (RuntimeError, AssertionError, ValueError) as exc:
        raise BackendUnavailableError(
            f"{argument}={str(parsed)!r} is not usable here: {exc}"
        ) from None
    return parsed


def check_fits(nbytes: int, device: torch.device, what: str) -> None:
    """``PoolSizeError`` when ``nbytes`` exceed the free memory of ``device`` (where known).

    Checked before allocating: a CPU allocation beyond memory can succeed and
    then get the process killed when its pages are zeroed.
    """
    free: int | None = None
    if device.type == "cpu":
        free = available_host_bytes()
    elif device.type == "cuda" and torch.cuda.is_available():
        free = int(torch.cuda.mem_get_info(device)[0])
    if free is not None and nbytes > free:
        raise PoolSizeError(
            f"{what} needs {nbytes / 1e9:.2f} GB but only {free / 1e9:.2f} GB of {device} "
            "memory is free"
        )
