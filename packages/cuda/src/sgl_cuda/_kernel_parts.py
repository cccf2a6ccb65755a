"""What the movers are built from and bind: the pool's ``StreamFence``; for the
``kernel`` mover (``sgl_cuda._movers``) host row views, address tables, index
uploads and a validated transfer's per-layer steps.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from sgl_core.backend import Component, HostLayout, HostSide, Transfer, layout_facts
from sgl_core.errors import UnsupportedLayoutError

__all__ = [
    "DeviceIndices",
    "Launch",
    "LayerSteps",
    "LoadPlan",
    "PointerTables",
    "StreamFence",
    "address_table",
    "check_kernel_rows",
    "index_rows",
    "layer_views",
    "upload",
]


@runtime_checkable
class PointerTables(Protocol):
    """A device pool that keeps its own per-layer address tables (the cuda pools)."""

    def pointer_table(self, device_name: str) -> torch.Tensor:
        """``torch.uint64`` addresses of the layers listed in attribute ``device_name``."""
        ...


def layer_views(host: HostSide) -> tuple[list[torch.Tensor], ...]:
    """Each part's per-row host views (strided in the page-first layouts), in part order."""
    facts = layout_facts(host.layout)
    return tuple(
        [facts.row(p.buffer, r) for r in range(p.component.rows(host.layer_num))]
        for p in host.parts
    )


def check_kernel_rows(layout: HostLayout, components: Sequence[Component]) -> None:
    """Refuse rows no ``kernel`` transfer could move, before any memory is taken.

    The kernels move rows (``page_head``: each head's slice of a row) as int64
    words; every part is checked, so no transfer can stop between K and V on a
    row size. Rows kept on a layer subset (the DSA indexer) move by the direct
    engine and are not checked.
    """
    per_head = not layout_facts(layout).heads_inner
    unit = "a head's slice of a row" if per_head else "a row"
    for c in components:
        heads = 1 if per_head else c.heads
        size = heads * c.dim * c.itemsize
        if c.layers is None and size % 8:
            raise UnsupportedLayoutError(
                f"layout={layout.value!r} runs io_backend='kernel', which moves rows as "
                f"8-byte words; {unit} of {c.name} here is {size} bytes ({heads} x {c.dim} "
                f"x {c.dtype}), not a multiple of 8: use layout 'page_first_direct' "
                "(io 'direct') or the 'torch' backend"
            )


def upload(indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``indices`` on ``device``; from CPU through a pinned snapshot, so the copy is async.

    A snapshot even of pinned input: the async copy must not read the
    caller's tensor after this returns (it may be reused for the next batch).
    """
    if indices.device == device:
        return indices.contiguous()
    if device.type == "cuda" and indices.device.type == "cpu":
        indices = torch.empty(indices.shape, dtype=indices.dtype, pin_memory=True).copy_(indices)
    return indices.to(device, non_blocking=True).contiguous()


class DeviceIndices:
    """Device copies of a validated load's indices, reused by the next layers' loads."""

    __slots__ = ("device", "device_indices", "event", "host_indices", "stream")

    def __init__(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, stream: torch.cuda.Stream
    ) -> None:
        self.device = host_indices.device
        self.host_indices = host_indices
        self.device_indices = device_indices
        self.stream = stream
        self.event = stream.record_event()


Launch = Callable[[torch.Tensor, torch.Tensor], None]


@dataclasses.dataclass(frozen=True)
class LayerSteps:
    """What a per-layer load of one validated transfer runs, bound once."""

    launches: tuple[Launch, ...]  # called with (host indices, device indices) on the device
    lock: Any  # the interpreter's launch lock, or a no-op context
    index_rows: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (host rows, device rows)


class LoadPlan:
    """A validated transfer's per-layer steps (bound on each layer's first load)."""

    __slots__ = ("host_cpu", "layers")

    def __init__(self, transfer: Transfer[Any], layer_num: int, index_rows: bool) -> None:
        # indexer rows gather on the host (read once per transfer, only where there are some)
        self.host_cpu = transfer.host_indices.to("cpu") if index_rows else transfer.host_indices
        self.layers: list[LayerSteps | None] = [None] * layer_num


def index_rows(
    host_rows: torch.Tensor, device_rows: torch.Tensor, host_cpu: torch.Tensor, d_idx: torch.Tensor
) -> None:
    """Indexer rows ``host_rows[host_cpu] -> device_rows[d_idx]``: one gather, one scatter.

    To a GPU through a pinned buffer, asynchronously (torch's pinned allocator
    keeps it until the copy is done).
    """
    pin = device_rows.device.type == "cuda"
    staged = torch.empty(
        (host_cpu.numel(), *host_rows.shape[1:]), dtype=host_rows.dtype, pin_memory=pin
    )
    torch.index_select(host_rows, 0, host_cpu, out=staged)
    device_rows.index_copy_(0, d_idx, staged.to(device_rows.device, non_blocking=pin))


def address_table(layers: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A ``torch.uint64`` table of ``layers``' addresses on ``device``."""
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64, device=device)


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
