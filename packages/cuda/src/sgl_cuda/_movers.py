"""The cuda host pools' ``kernel`` mover, one for every kind of KV rows.

Built from a ``HostSide`` and the pool's ``StreamFence``, never from the pool.
A backup is one launch over every layer, a load one launch for one layer;
parts of equal row width share a launch (MHA K and V), a part of another width
is its own launch, checked before the first one runs (docs/design.md section 6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

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
from sgl_cuda._kernel_parts import (
    DeviceIndices,
    Launch,
    LayerSteps,
    LoadPlan,
    PointerTables,
    StreamFence,
    address_table,
    check_kernel_rows,
    index_rows,
    layer_views,
    upload,
)
from sgl_cuda._kernels import interpreter_active, interpreter_launch
from sgl_cuda._kv_checks import RowForm, bind_rows

__all__ = [
    "KernelMover",
    "PointerTables",
    "address_table",
    "check_kernel_rows",
    "layer_views",
]


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
        # How each part's host side addresses its rows (page-first: token stride).
        self.forms = tuple(
            self._form(c, host.page_size, host.parts[c].component.heads)
            for c in range(len(self.rows))
        )
        # Opt-in: per-layer loads of the same (already validated) indices reuse their
        # device copies. Off until it has run on a GPU (only a CUDA test covers it).
        self.reuse_index_uploads = False
        self._uploads: PlanCache[DeviceIndices] = PlanCache()
        self._plans: PlanCache[LoadPlan] = PlanCache()

    def _form(self, c: int, page_size: int, heads: int) -> tuple[str, int, int, int]:
        dim = self.rows[c] * self.layer_num
        if self.layout is HostLayout.LAYER_FIRST:
            return ("layer_first", 0, 1, 1)
        if self.layout is HostLayout.PAGE_FIRST:
            return ("page_first", dim, 1, 1)
        return ("page_head", dim, page_size, heads)

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
        return LoadPlan(transfer, self.layer_num, bool(self.index_parts))

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
        for comps in self.groups:
            kind, dim, ps, heads = self.forms[comps[0]]
            if kind == "layer_first" and not per_layer:
                kind = "table"
            host_form = RowForm(kind, host_side, dim, ps, heads)
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
        if cached is not None and cached.device == device:
            if cached.stream != stream:
                # Uploaded on another stream: order after it, and keep the memory
                # alive until this stream is done with it.
                stream.wait_event(cached.event)
                cached.host_indices.record_stream(stream)
                cached.device_indices.record_stream(stream)
            return cached.host_indices, cached.device_indices
        h_idx = upload(transfer.host_indices, device)
        d_idx = upload(transfer.device_indices, device)
        self._uploads.put(transfer, DeviceIndices(h_idx, d_idx, stream))
        return h_idx, d_idx
