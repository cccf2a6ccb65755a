"""The cuda host pools' ``kernel`` mover, one for every kind of KV rows.

It is built from a ``HostSide`` (the host parts: one buffer per component
of the KV spec, ``kv`` for MLA, ``k`` and ``v`` for MHA) and the pool's
``StreamFence``, never from the pool, and records the point after each
transfer in that fence so the pool's host-side readers (the L3 page helpers)
wait for queued copies.

``KernelMover`` runs the Triton launches of ``sgl_cuda._kvcacheio_mha``: a
backup is one launch over every layer (device pointer tables to the host's
per-row address tables for ``layer_first``, to the host bases for
``page_first`` and ``page_head``), a load one launch for one layer. Parts of
equal row width share a launch (MHA K and V); a part of another width (V
narrower than K) is its own launch, checked before the first one runs.

The ``direct`` mover is ``sgl_cuda._direct_mover.CudaDirectMover``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from sgl_core.backend import Component, HostLayout, HostSide, PlanCache, Transfer, layout_facts
from sgl_core.errors import BackendUnavailableError, PoolMismatchError, UnsupportedLayoutError
from sgl_cuda._kernels import interpreter_active
from sgl_cuda._kvcacheio_mha import RowForm, prepare_rows
from sgl_cuda._stream_fence import StreamFence

__all__ = [
    "KernelMover",
    "PointerTables",
    "address_table",
    "check_kernel_rows",
    "layer_views",
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


def _upload(indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``indices`` on ``device``; from CPU through a pinned snapshot, so the copy is async.

    A snapshot even of pinned input: the async copy must not read the
    caller's tensor after this returns (it may be reused for the next batch).
    """
    if indices.device == device:
        return indices.contiguous()
    if device.type == "cuda" and indices.device.type == "cpu":
        indices = torch.empty(indices.shape, dtype=indices.dtype, pin_memory=True).copy_(indices)
    return indices.to(device, non_blocking=True).contiguous()


class _DeviceIndices:
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


class KernelMover:
    """``kernel`` io for ``layer_first``, ``page_first`` and ``page_head``, any kind."""

    def __init__(self, host: HostSide, fence: StreamFence | None = None) -> None:
        self.layout = host.layout
        self.layer_num = host.layer_num
        self.pin_memory = host.pin_memory
        self.fence = StreamFence() if fence is None else fence
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
        self._uploads: PlanCache[_DeviceIndices] = PlanCache()

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
        h_idx = _upload(transfer.host_indices, device)
        d_idx = _upload(transfer.device_indices, device)
        if isinstance(device_pool, PointerTables):
            src = tuple(device_pool.pointer_table(name) for name in self.names)
        else:  # a foreign per-layer pool (e.g. the torch backend's): build its tables
            src = tuple(address_table(getattr(device_pool, name), device) for name in self.names)
        layer_first = self.layout is HostLayout.LAYER_FIRST
        dst = self.host_tables(device) if layer_first else self.hosts
        self._launch(src, dst, d_idx, h_idx, host_side="dst", layer=None)
        self.fence.record(device)

    def load(self, transfer: Transfer[Any], layer_id: int) -> None:
        device = transfer.device_pool.device
        h_idx, d_idx = self._load_indices(transfer, device)
        if self.layout is HostLayout.LAYER_FIRST:
            src = tuple(views[layer_id] for views in self._views)
            offset = 0  # a layer's own rows
        else:
            src, offset = self.hosts, layer_id
        dst = tuple(getattr(transfer.device_pool, name)[layer_id] for name in self.names)
        self._launch(src, dst, h_idx, d_idx, host_side="src", layer=offset)
        self.fence.record(device)

    def _launch(
        self,
        src: Sequence[torch.Tensor],
        dst: Sequence[torch.Tensor],
        src_idx: torch.Tensor,
        dst_idx: torch.Tensor,
        *,
        host_side: str,
        layer: int | None,
    ) -> None:
        """One launch per group of parts; every launch is checked before the first runs,
        so a refused V never leaves K moved."""
        per_layer = layer is not None
        device_side = "dst" if host_side == "src" else "src"
        device_form = RowForm("layer_first" if per_layer else "table", device_side)
        launches: list[Callable[[], None]] = []
        for comps in self.groups:
            kind, dim, ps, heads = self.forms[comps[0]]
            if kind == "layer_first" and not per_layer:
                kind = "table"
            host_form = RowForm(kind, host_side, dim, ps, heads)
            forms = (host_form, device_form) if host_side == "src" else (device_form, host_form)
            launches.append(
                prepare_rows(
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
            )
        for launch in launches:
            launch()

    def _load_indices(
        self, transfer: Transfer[Any], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Device copies of a load's indices: uploaded once per validated transfer (opt-in)."""
        if device.type != "cuda" or not self.reuse_index_uploads:
            return _upload(transfer.host_indices, device), _upload(transfer.device_indices, device)
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
        h_idx = _upload(transfer.host_indices, device)
        d_idx = _upload(transfer.device_indices, device)
        self._uploads.put(transfer, _DeviceIndices(h_idx, d_idx, stream))
        return h_idx, d_idx


def address_table(layers: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A ``torch.uint64`` table of ``layers``' addresses on ``device``."""
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64, device=device)
