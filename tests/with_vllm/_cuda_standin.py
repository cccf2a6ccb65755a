"""A CPU stand-in for exactly the CUDA pieces of vLLM 0.33's CPU offloading worker.

vLLM's ``CPUOffloadingWorker`` (``vllm/v1/kv_offload/cpu/gpu_worker.py``) is
Python around four device facilities; everything else it runs is its own code.
On a CPU machine these are replaced, and nothing more:

1. ``vllm._custom_ops.swap_blocks_batch(src_ptrs, dst_ptrs, sizes, ...)``, the
   compiled op (``cuMemcpyBatchAsync``: copy ``sizes[i]`` bytes from address
   ``src_ptrs[i]`` to ``dst_ptrs[i]`` for every ``i``). Stand-in: the same
   copies on the CPU, one ``memmove`` per descriptor (:func:`swap_blocks_batch`),
   or one call into a C loop of ``memcpy`` where a C compiler is at hand
   (:func:`c_swap_blocks_batch`, the benchmark's choice: one call for the
   batch, as the driver call is). Its time is counted apart (:data:`OP_SECONDS`).
2. CUDA streams and events (``current_platform.Stream()``,
   ``current_stream()``, ``stream(s)``, ``torch.Event(enable_timing=True)``):
   the copies above finish before they return, so a stream is a no-op and an
   event records ``perf_counter`` (``query()`` is True, ``elapsed_time`` in ms).
3. Pinned host memory (``PIN_MEMORY``): CPU torch cannot pin, so it is False
   (vLLM's own pageable path: it then selects ``swap_blocks_batch`` both ways).
4. The KV caches' device: the handler asserts ``gpu_tensor.is_cuda``;
   :class:`DeviceTensor` is a CPU tensor that answers True (same storage).

``get_worker``'s platform check (``is_cuda_alike() or is_xpu()``) is the one
line of vLLM's Python skipped: callers run ``create_worker``, which
``get_worker`` calls past that check.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

OP_SECONDS = [0.0]  # time spent inside the stand-in copy op (benchmarks read it)


def swap_blocks_batch(
    src_ptrs: torch.Tensor,
    dst_ptrs: torch.Tensor,
    sizes: torch.Tensor,
    is_src_access_order_any: bool = False,
) -> None:
    """``ops.swap_blocks_batch`` on the CPU: one memmove per descriptor."""
    start = time.perf_counter()
    for src, dst, n in zip(src_ptrs.tolist(), dst_ptrs.tolist(), sizes.tolist(), strict=True):
        ctypes.memmove(dst, src, n)
    OP_SECONDS[0] += time.perf_counter() - start


_C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
void batch_copy(const int64_t *src, const int64_t *dst, const int64_t *n, int64_t count) {
    for (int64_t i = 0; i < count; ++i)
        memcpy((void *)(intptr_t)dst[i], (const void *)(intptr_t)src[i], (size_t)n[i]);
}
"""


def c_swap_blocks_batch() -> Callable[..., None] | None:
    """``ops.swap_blocks_batch`` as one call into a C ``memcpy`` loop (None: no compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    folder = tempfile.mkdtemp(prefix="sgl_swap_")
    src, lib = os.path.join(folder, "swap.c"), os.path.join(folder, "swap.so")
    with open(src, "w") as f:
        f.write(_C_SOURCE)
    if subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib], check=False).returncode:
        return None
    fn = ctypes.CDLL(lib).batch_copy
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def batch(
        src_ptrs: torch.Tensor,
        dst_ptrs: torch.Tensor,
        sizes: torch.Tensor,
        is_src_access_order_any: bool = False,
    ) -> None:
        start = time.perf_counter()
        assert src_ptrs.dtype == dst_ptrs.dtype == sizes.dtype == torch.int64
        fn(src_ptrs.data_ptr(), dst_ptrs.data_ptr(), sizes.data_ptr(), sizes.numel())
        OP_SECONDS[0] += time.perf_counter() - start

    return batch


class CpuStream:
    """A CUDA stream whose work is already done when queued (copies are synchronous)."""

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None


class CpuEvent:
    """A CUDA event over ``perf_counter``: recorded work is already finished."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: CpuEvent) -> float:
        return (end.t - self.t) * 1e3


class DeviceTensor(torch.Tensor):
    """A CPU tensor standing in for device memory (``is_cuda`` is True; same storage)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def as_device(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(DeviceTensor)


_CURRENT = CpuStream()


@contextlib.contextmanager
def cpu_as_cuda(op: Callable[..., None] | None = None) -> Iterator[None]:
    """Patch the four facilities above while vLLM's worker is built and runs."""
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform
    from vllm.v1.kv_offload.cpu import gpu_worker

    saved_op, saved_pin, saved_event = ops.swap_blocks_batch, gpu_worker.PIN_MEMORY, torch.Event
    ops.swap_blocks_batch = op or swap_blocks_batch
    gpu_worker.PIN_MEMORY = False
    torch.Event = CpuEvent  # type: ignore[misc,assignment]
    current_platform.Stream = CpuStream
    current_platform.current_stream = lambda *a, **k: _CURRENT
    current_platform.stream = lambda s: contextlib.nullcontext()
    try:
        yield
    finally:
        ops.swap_blocks_batch = saved_op
        gpu_worker.PIN_MEMORY = saved_pin
        torch.Event = saved_event  # type: ignore[misc]
        for name in ("Stream", "current_stream", "stream"):
            with contextlib.suppress(AttributeError):
                delattr(current_platform, name)
