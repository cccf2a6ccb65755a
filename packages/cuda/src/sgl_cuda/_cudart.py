"""``cudaMemcpyBatchAsync`` through the CUDA runtime torch already loaded (ctypes).

The only module that touches ctypes. It finds ``libcudart`` in this order: the
copy already mapped into the process (``/proc/self/maps``: torch's own), torch's
``lib`` directory, the ``nvidia`` wheel directories next to torch, then the
loader's search path. The batch call exists from CUDA 12.8; 12.8-12.9 take an
extra ``size_t* failIdx`` argument that CUDA 13 removed, so the argument list is
chosen from ``cudaRuntimeGetVersion``.

Pointer, size and attribute arrays are read by the runtime during the call, so
plain (pageable) CPU int64 tensors are enough. A batch is queued on the
current stream, or on a side stream ordered both ways with it when that is
the legacy NULL stream (refused by the API).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from dataclasses import dataclass

import torch

__all__ = [
    "BatchCopyError",
    "MEM_DEVICE",
    "MEM_HOST",
    "Runtime",
    "find_libcudart",
    "runtime",
]

# cudaMemLocationType
MEM_DEVICE = 1
MEM_HOST = 2
_SRC_ACCESS_ORDER_STREAM = 1
_FLAG_PREFER_OVERLAP_WITH_COMPUTE = 1
_FIRST_BATCH_VERSION = 12080
_NO_FAIL_IDX_VERSION = 13000
# Copies per runtime call: bounds the arrays the driver walks in one call.
MAX_BATCH = 1 << 14


class BatchCopyError(RuntimeError):
    """The CUDA runtime rejected a batched copy (no copy of the batch is guaranteed done)."""


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemcpyAttributes(ctypes.Structure):
    """``struct cudaMemcpyAttributes`` (driver_types.h, CUDA 12.8 and 13)."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


def find_libcudart() -> ctypes.CDLL | None:
    """The first loadable ``libcudart`` in the order of the module docstring, or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            mapped = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        mapped = set()
    found = sorted(p for p in mapped if os.path.isfile(p))
    torch_dir = os.path.dirname(torch.__file__)
    site = os.path.dirname(torch_dir)
    patterns = [
        os.path.join(torch_dir, "lib", "libcudart.so*"),
        os.path.join(site, "nvidia", "cu*", "lib", "libcudart.so*"),
        os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*"),
    ]
    for pattern in patterns:
        found.extend(sorted(glob.glob(pattern), reverse=True))
    for path in [*found, "libcudart.so", "libcudart.so.13", "libcudart.so.12"]:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@dataclass(frozen=True)
class Runtime:
    """A loaded runtime: its version and (when present) the batched-copy entry point."""

    lib: ctypes.CDLL
    version: int

    @property
    def has_batch(self) -> bool:
        return self.version >= _FIRST_BATCH_VERSION and hasattr(self.lib, "cudaMemcpyBatchAsync")

    def queue(
        self,
        pieces: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        device_index: int,
        on_device: tuple[bool, bool],
        *,
        prefer_overlap: bool,
    ) -> None:
        """Queue ``pieces`` (``src``, ``dst``, ``size``) on the current stream of the device,
        in calls of at most ``MAX_BATCH`` copies; ``on_device``: src, dst on the GPU."""
        with torch.cuda.device(device_index):
            current = torch.cuda.current_stream(device_index)
            stream = current
            if current.cuda_stream == 0:  # the legacy stream: the API refuses it
                with _lock:
                    if device_index not in _side_streams:
                        _side_streams[device_index] = torch.cuda.Stream(device_index)  # type: ignore[no-untyped-call]
                    stream = _side_streams[device_index]
                stream.wait_stream(current)
            src, dst, size = (t.contiguous() for t in pieces)
            try:
                for lo in range(0, size.numel(), MAX_BATCH):
                    hi = lo + MAX_BATCH
                    self.memcpy_batch(
                        dst[lo:hi],
                        src[lo:hi],
                        size[lo:hi],
                        stream.cuda_stream,
                        device_index=device_index,
                        src_on_device=on_device[0],
                        dst_on_device=on_device[1],
                        prefer_overlap=prefer_overlap,
                    )
            finally:
                # Also after a failed chunk: chunks already queued stay ordered before
                # whatever the current stream does next (e.g. the per-piece fallback).
                if stream is not current:
                    current.wait_stream(stream)

    def memcpy_batch(
        self,
        dsts: torch.Tensor,
        srcs: torch.Tensor,
        sizes: torch.Tensor,
        stream: int,
        *,
        device_index: int,
        src_on_device: bool,
        dst_on_device: bool,
        prefer_overlap: bool = True,
    ) -> None:
        """Queue ``sizes[i]`` bytes ``srcs[i] -> dsts[i]`` for every i on ``stream``.

        ``dsts``/``srcs``/``sizes`` are contiguous CPU int64 tensors of equal
        length (addresses and byte counts). ``stream`` must not be 0 (legacy).
        """
        count = sizes.numel()
        for name, t in (("dsts", dsts), ("srcs", srcs), ("sizes", sizes)):
            if t.device.type != "cpu" or t.dtype != torch.int64 or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous CPU int64 tensor")
            if t.numel() != count:
                raise ValueError("dsts, srcs and sizes must have equal length")
        if count == 0:
            return
        if stream == 0:
            raise ValueError("cudaMemcpyBatchAsync does not accept the legacy NULL stream")
        attr = MemcpyAttributes()
        attr.srcAccessOrder = _SRC_ACCESS_ORDER_STREAM
        gpu, host = _MemLocation(MEM_DEVICE, device_index), _MemLocation(MEM_HOST, 0)
        attr.srcLocHint = gpu if src_on_device else host
        attr.dstLocHint = gpu if dst_on_device else host
        attr.flags = _FLAG_PREFER_OVERLAP_WITH_COMPUTE if prefer_overlap else 0
        attr_idx = ctypes.c_size_t(0)
        ptr = ctypes.c_void_p
        args: list[object] = [
            ptr(dsts.data_ptr()),
            ptr(srcs.data_ptr()),
            ptr(sizes.data_ptr()),
            ctypes.c_size_t(count),
            ctypes.byref(attr),
            ctypes.byref(attr_idx),
            ctypes.c_size_t(1),
        ]
        fail_idx = ctypes.c_size_t(0)
        if self.version < _NO_FAIL_IDX_VERSION:
            args.append(ctypes.byref(fail_idx))
        args.append(ptr(stream))
        code = int(self.lib.cudaMemcpyBatchAsync(*args))
        if code:
            name = self.lib.cudaGetErrorString(code)  # restype set at load: bytes or None
            text = name.decode() if isinstance(name, bytes) else f"cudaError {code}"
            where = f" (copy {fail_idx.value})" if self.version < _NO_FAIL_IDX_VERSION else ""
            raise BatchCopyError(
                f"cudaMemcpyBatchAsync of {count} copies failed{where}: {text} ({code})"
            )


_lock = threading.Lock()
_loaded: list[Runtime | None] = []
_side_streams: dict[int, torch.cuda.Stream] = {}


def runtime() -> Runtime | None:
    """The process's CUDA runtime (loaded once), or None when none can be loaded."""
    with _lock:
        if not _loaded:
            _loaded.append(_load())
        return _loaded[0]


def _load() -> Runtime | None:
    lib = find_libcudart()
    if lib is None:
        return None
    version = ctypes.c_int(0)
    try:
        lib.cudaRuntimeGetVersion.restype = ctypes.c_int
        if lib.cudaRuntimeGetVersion(ctypes.byref(version)) != 0:
            return None
    except AttributeError:
        return None
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    lib.cudaGetErrorString.argtypes = [ctypes.c_int]
    if hasattr(lib, "cudaMemcpyBatchAsync"):
        lib.cudaMemcpyBatchAsync.restype = ctypes.c_int
    return Runtime(lib, int(version.value))
