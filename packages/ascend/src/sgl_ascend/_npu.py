"""The only module of sgl_ascend that touches ``torch_npu``.

``torch_npu`` is the optional ``sgl-ascend[npu]`` extra. It needs Ascend's
CANN libraries to import, and once installed it patches ``import torch``; so
it is imported lazily, here, and only when an NPU is actually asked for.
Everything else in the package runs on CPU tensors without it.

Integrators: :func:`resolve_device` is how pools turn a ``device`` argument
into a ``torch.device``; asking for ``"npu"`` without a working ``torch_npu``
raises :class:`sgl_core.errors.BackendUnavailableError` saying what to install.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from sgl_core.backend import parse_device, usable_device
from sgl_core.errors import BackendUnavailableError

__all__ = [
    "grouped_matmul",
    "import_torch_npu",
    "npu_available",
    "resolve_device",
    "synchronize",
    "transfer_stream",
]

_INSTALL_HINT = (
    "device 'npu' needs torch_npu: pip install './packages/ascend[npu]' "
    "(torch-npu also requires Ascend's CANN toolkit to be installed and sourced)"
)


@functools.lru_cache(maxsize=1)
def _load() -> ModuleType | Exception:
    try:
        import torch_npu
    except Exception as exc:  # ImportError, or OSError/RuntimeError without CANN
        return exc
    module: ModuleType = torch_npu
    return module


def import_torch_npu() -> ModuleType:
    """Import ``torch_npu`` or raise ``BackendUnavailableError`` with the install hint."""
    loaded = _load()
    if isinstance(loaded, Exception):
        raise BackendUnavailableError(f"{_INSTALL_HINT}; import failed: {loaded}") from loaded
    return loaded


def npu_available() -> bool:
    """True only when ``torch_npu`` imports and at least one NPU is visible."""
    if isinstance(_load(), Exception):
        return False
    try:
        npu: Any = getattr(torch, "npu", None)
        return npu is not None and bool(npu.is_available()) and int(npu.device_count()) > 0
    except Exception:
        return False


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` -> the first NPU when one is usable, else CPU; ``"npu[:i]"`` needs torch_npu."""
    if device is None:
        return torch.device("npu") if npu_available() else torch.device("cpu")
    if isinstance(device, str) and device.split(":", 1)[0].strip().lower() == "npu":
        text = device  # torch parses "npu" only once torch_npu is imported
    else:
        parsed = parse_device(device)
        assert parsed is not None
        if parsed.type != "npu":
            return usable_device(parsed)
        text = str(parsed)
    import_torch_npu()
    if not npu_available():
        raise BackendUnavailableError(
            f"device={text!r}: torch_npu imported but no NPU is visible "
            "(check the driver, CANN and ASCEND_RT_VISIBLE_DEVICES)"
        )
    return torch.device(text)


@contextlib.contextmanager
def transfer_stream(device: torch.device) -> Iterator[None]:
    """Run the enclosed copies on a per-device side stream, ordered with the caller's.

    The side stream first waits for the caller's current stream (so it sees
    every write queued before the call) and the current stream then waits
    for the side stream (so later work sees the copied bytes): callers keep
    plain stream semantics. Outside NPUs this is a no-op.
    """
    if device.type != "npu":
        yield
        return
    import_torch_npu()
    npu: Any = getattr(torch, "npu")  # noqa: B009 - attribute added by torch_npu
    current = npu.current_stream(device)
    side = _side_stream(device)
    side.wait_stream(current)
    with npu.stream(side):
        yield
    current.wait_stream(side)


def synchronize(device: torch.device) -> None:
    """Wait for all work queued on ``device``; a no-op outside NPUs (copies are synchronous)."""
    if device.type != "npu":
        return
    import_torch_npu()
    npu: Any = getattr(torch, "npu")  # noqa: B009 - attribute added by torch_npu
    npu.synchronize(device)


@functools.cache
def _side_stream(device: torch.device) -> Any:
    npu: Any = getattr(torch, "npu")  # noqa: B009 - attribute added by torch_npu
    return npu.Stream(device=device)


def grouped_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    group_list: torch.Tensor,
    *,
    output_dtype: torch.dtype,
    scale: torch.Tensor | None = None,
    per_token_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch_npu.npu_grouped_matmul`` over expert-sorted rows (NPU only).

    ``x (T, K)`` rows sorted by expert, ``weight (E, K, N)``, ``group_list``
    the inclusive cumulative row count per expert (``group_list_type=0``).
    W8A8: int8 ``x``/``weight`` with ``scale (E, N)`` and ``per_token_scale (T,)``.
    """
    torch_npu: Any = import_torch_npu()
    scales = (("scale", scale), ("per_token_scale", per_token_scale))
    kwargs = {name: [t] for name, t in scales if t is not None}
    out = torch_npu.npu_grouped_matmul(
        x=[x],
        weight=[weight],
        split_item=2,
        group_list_type=0,
        group_type=0,
        group_list=group_list,
        output_dtype=output_dtype,
        **kwargs,
    )
    result: torch.Tensor = out[0]
    return result
