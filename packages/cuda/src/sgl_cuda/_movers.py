"""The cuda host pools' ``kernel`` mover, one for every kind of KV rows, and what it binds.

Built from a ``HostSide`` and the pool's ``StreamFence``, never from the pool.
A backup is one launch over every layer, a load one launch for one layer;
parts of equal row width share a launch (MHA K and V), a part of another width
is its own launch, checked before the first one runs (docs/design.md section 6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from sgl_core.backend import (
    DirectMover,
    HostLayout,
    HostSide,
    PlanCache,
    Transfer,
    byte_view,
    layout_facts,
)
from sgl_core.errors import BackendUnavailableError, PoolMismatchError, UnsupportedLayoutError
from sgl_cuda._kernels import StreamFence, interpreter_active, interpreter_launch
from sgl_cuda._kv_checks import RowForm, bind_rows

__all__ = ["KernelMover", "PointerTables", "address_table", "layer_views", "upload"]

Launch = Callable[[torch.Tensor, torch.Tensor], None]


@runtime_checkable
class PointerTables(Protocol):
    """A device pool that keeps its own per-layer address tables (the cuda pools)."""

    def pointer_table(self, device_name: str) -> torch.Tensor:
        """``torch.uint64`` addresses of the layers listed in attribute ``device_name``."""
        ...


def layer_views(host: HostSide) -> tuple[list[torch.Tensor], ...]:
    """The per-row host views (strided in the page-first layouts) of each every-layer part."""
    facts = layout_facts(host.layout)
    return tuple(
        [facts.row(p.buffer, r) for r in range(p.component.rows(host.layer_num))]
        for p in host.parts
        if p.component.layers is None
    )


def address_table(layers: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A ``torch.uint64`` table of ``layers``' addresses on ``device``."""
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64, device=device)


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


def index_rows(
    host_rows: torch.Tensor, device_rows: torch.Tensor, host_cpu: torch.Tensor, d_idx: torch.Tensor
) -> None:
    """Indexer rows ``host_rows[host_cpu] -> device_rows[d_idx]``: one gather, one scatter;
    to a GPU through a pinned buffer, asynchronously (torch's pinned allocator keeps it
    until the copy is done)."""
    pin = device_rows.device.type == "cuda"
    staged = torch.empty(
        (host_cpu.numel(), *host_rows.shape[1:]), dtype=host_rows.dtype, pin_memory=pin
    )
    torch.index_select(host_rows, 0, host_cpu, out=staged)
    device_rows.index_copy_(0, d_idx, staged.to(device_rows.device, non_blocking=pin))


@dataclasses.dataclass(frozen=True)
class DeviceIndices:
    """Device copies of a validated load's indices, reused by the next layers' loads."""

    host_indices: torch.Tensor
    device_indices: torch.Tensor
    stream: torch.cuda.Stream  # the stream they were uploaded on
    event: torch.cuda.Event  # recorded on it after the upload


@dataclasses.dataclass(frozen=True)
class LayerSteps:
    """What a per-layer load of one validated transfer runs, bound once."""

    launches: tuple[Launch, ...]  # called with (host indices, device indices) on the device
    lock: Any  # the interpreter's launch lock, or a no-op context
    index_rows: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (host rows, device rows)


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """A validated transfer's per-layer steps (bound on each layer's first load)."""

    host_cpu: torch.Tensor  # the host indices, on the CPU where indexer rows gather
    layers: list[LayerSteps | None]


class KernelMover:
    """``kernel`` io for ``layer_first``, ``page_first`` and ``page_head``, any kind.

    Parts on a layer subset (the DSA indexer's rows) move with the KV, by
    gathers (their rows need not be 8-byte words): on a per-layer load only
    where the layer has a row of them, before the kernel, on the same stream.
    """

    def __init__(self, host: HostSide, fence: StreamFence | None = None) -> None:
        self.layout = host.layout
        self.layer_num = host.layer_num
        self.pin_memory = host.pin_memory
        self.fence = StreamFence() if fence is None else fence
        subset = tuple(p for p in host.parts if p.component.layers is not None)
        self.index_parts = subset
        self._index_mover = DirectMover(host, subset) if subset else None
        self._facts = layout_facts(host.layout)
        host = dataclasses.replace(
            host, parts=tuple(p for p in host.parts if p.component.layers is None)
        )
        self.hosts = tuple(p.buffer for p in host.parts)
        self.names = tuple(p.component.device_name for p in host.parts)
        self.rows = tuple(p.component.row_bytes for p in host.parts)
        self._views = layer_views(host)
        self._host_tables: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        # Parts of one row width move in one launch (at most two per launch).
        same = len(self.rows) == 2 and self.rows[0] == self.rows[1]
        self.groups = ((0, 1),) if same else tuple((c,) for c in range(len(self.rows)))
        # How each part's host side addresses its rows: RowForm's (layout_dim, page_size, heads).
        self.forms = tuple(
            (row * self.layer_num, host.page_size, p.component.heads)
            for row, p in zip(self.rows, host.parts, strict=True)
        )
        # Opt-in: per-layer loads of the same (already validated) indices reuse their
        # device copies. Off until it has run on a GPU (only a CUDA test covers it).
        self.reuse_index_uploads = False
        self._uploads: PlanCache[DeviceIndices] = PlanCache()
        self._plans: PlanCache[LoadPlan] = PlanCache()

    def check(self, device_pool: Any) -> None:
        device = device_pool.device
        if device.type == "cuda":
            if not self.pin_memory:
                raise UnsupportedLayoutError(
                    "io_backend='kernel' reaches host memory from the GPU and needs it "
                    "pinned; this pool was built with pin_memory=False (use 'direct')"
                )
        elif not (device.type == "cpu" and interpreter_active()):
            raise BackendUnavailableError(
                f"io_backend='kernel' needs a CUDA device pool (got {device}); CPU pools "
                "work only under TRITON_INTERPRET=1"
            )
        # The kernels step rows by the row size and move int64 words: every layer
        # must be dense (``set_`` can make one strided), start on an 8-byte
        # boundary and be on the pool's device.
        for name in self.names:
            for i, layer in enumerate(getattr(device_pool, name)):
                if not layer.is_contiguous() or layer.device != device or layer.data_ptr() % 8:
                    raise PoolMismatchError(
                        f"device_pool.{name}[{i}] must be contiguous on {device} and start "
                        "on an 8-byte boundary for io_backend='kernel'"
                    )

    def synchronize(self) -> None:
        self.fence.synchronize()

    def host_tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Each part's host per-row address table on ``device`` (built once per device)."""
        tables = self._host_tables.get(device)
        if tables is None:
            tables = tuple(address_table(views, device) for views in self._views)
            self._host_tables[device] = tables
        return tables

    def backup(self, transfer: Transfer[Any]) -> None:
        device_pool = transfer.device_pool
        device = device_pool.device
        h_idx = upload(transfer.host_indices, device)
        d_idx = upload(transfer.device_indices, device)
        if isinstance(device_pool, PointerTables):
            src = tuple(device_pool.pointer_table(name) for name in self.names)
        else:  # a foreign per-layer pool (e.g. the torch backend's): build its tables
            src = tuple(address_table(getattr(device_pool, name), device) for name in self.names)
        layer_first = self.layout is HostLayout.LAYER_FIRST
        dst = self.host_tables(device) if layer_first else self.hosts
        launches, interpreted = self._bind(src, dst, d_idx, h_idx, host_side="dst", layer=None)
        if self._index_mover is not None:  # indexer rows first, on the same stream
            self._index_mover.backup(transfer)
        with interpreter_launch(interpreted):
            for launch in launches:
                launch(d_idx, h_idx)
        self.fence.record(device)

    def load(self, transfer: Transfer[Any], layer_id: int) -> None:
        device = transfer.device_pool.device
        h_idx, d_idx = self._load_indices(transfer, device)
        plan = self._plans.get(transfer, self._new_plan)
        steps = plan.layers[layer_id]
        if steps is None:  # every launch of the layer checked before the first runs
            steps = plan.layers[layer_id] = self._bind_load(transfer, layer_id, h_idx, d_idx)
        for host_rows, device_rows in steps.index_rows:
            index_rows(host_rows, device_rows, plan.host_cpu, d_idx)
        with steps.lock:
            for launch in steps.launches:
                launch(h_idx, d_idx)
        self.fence.record(device)

    def _new_plan(self, transfer: Transfer[Any]) -> LoadPlan:
        # indexer rows gather on the host (read once per transfer, only where there are some)
        host = transfer.host_indices
        return LoadPlan(host.to("cpu") if self.index_parts else host, [None] * self.layer_num)

    def _bind_load(
        self, transfer: Transfer[Any], layer_id: int, h_idx: torch.Tensor, d_idx: torch.Tensor
    ) -> LayerSteps:
        pool = transfer.device_pool
        if self.layout is HostLayout.LAYER_FIRST:
            src = tuple(views[layer_id] for views in self._views)
            offset = 0  # a layer's own rows
        else:
            src, offset = self.hosts, layer_id
        dst = tuple(getattr(pool, name)[layer_id] for name in self.names)
        launches, interpreted = self._bind(src, dst, h_idx, d_idx, host_side="src", layer=offset)
        index_rows = []
        for part in self.index_parts:
            slot = part.component.slot(layer_id)
            if slot is not None:
                host_rows = byte_view(self._facts.row(part.buffer, slot))
                device_rows = byte_view(getattr(pool, part.component.device_name)[slot])
                index_rows.append((host_rows, device_rows))
        return LayerSteps(launches, interpreter_launch(interpreted), tuple(index_rows))

    def _bind(
        self,
        src: Sequence[torch.Tensor],
        dst: Sequence[torch.Tensor],
        src_idx: torch.Tensor,
        dst_idx: torch.Tensor,
        *,
        host_side: str,
        layer: int | None,
    ) -> tuple[tuple[Launch, ...], bool]:
        """One bound launch per group of parts, every one checked before any runs,
        so a refused V never leaves K moved."""
        per_layer = layer is not None
        device_side = "dst" if host_side == "src" else "src"
        device_form = RowForm("layer_first" if per_layer else "table", device_side)
        launches: list[Launch] = []
        interpreted = False
        layer_first = self.layout is HostLayout.LAYER_FIRST
        kind = "table" if layer_first and not per_layer else self.layout.value
        for comps in self.groups:
            host_form = RowForm(kind, host_side, *self.forms[comps[0]])
            forms = (host_form, device_form) if host_side == "src" else (device_form, host_form)
            launch, interpreted = bind_rows(
                tuple(src[c] for c in comps),
                tuple(dst[c] for c in comps),
                src_idx,
                dst_idx,
                item_size=self.rows[comps[0]],
                src_form=forms[0],
                dst_form=forms[1],
                layer_offset=layer or 0,
                num_layers=1 if per_layer else self.layer_num,
            )
            launches.append(launch)
        return tuple(launches), interpreted

    def _load_indices(
        self, transfer: Transfer[Any], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Device copies of a load's indices: uploaded once per validated transfer (opt-in)."""
        if device.type != "cuda" or not self.reuse_index_uploads:
            return upload(transfer.host_indices, device), upload(transfer.device_indices, device)
        stream = torch.cuda.current_stream(device)
        cached = self._uploads.peek(transfer)
        if cached is not None and cached.host_indices.device == device:
            if cached.stream != stream:
                # Uploaded on another stream: order after it, and keep the memory
                # alive until this stream is done with it.
                stream.wait_event(cached.event)
                cached.host_indices.record_stream(stream)
                cached.device_indices.record_stream(stream)
            return cached.host_indices, cached.device_indices
        h_idx = upload(transfer.host_indices, device)
        d_idx = upload(transfer.device_indices, device)
        self._uploads.put(transfer, DeviceIndices(h_idx, d_idx, stream, stream.record_event()))
        return h_idx, d_idx
