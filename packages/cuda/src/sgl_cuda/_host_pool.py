"""CUDA MLA host pool: token-row host layouts moved by Triton kernels or slice copies.

Supported pairs (DESIGN §3):

* ``layer_first``        ``kernel``, ``direct``
* ``page_first``         ``kernel``
* ``page_first_direct``  ``direct``

``kernel`` backs up every layer in one launch through the pointer tables
(device ``data_ptrs`` -> host ``data_ptrs`` for ``layer_first``, device
``data_ptrs`` -> page-first host base for ``page_first``) and loads one layer
per launch. ``direct`` merges index runs into slice copies.

Transfers are stream-ordered, as in the serving engines: they return once
queued on the current CUDA stream, so the engine can overlap them with
compute and track them with its own events. The pool's own host-side readers
and writers (the L3 page helpers) first wait for the last transfer it queued;
other host-side readers call :meth:`CudaMLAHostPool.synchronize`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from sgl_core.backend import HostLayout, IOBackend, MLADevicePool, TokenRowHostPool, device_layers
from sgl_core.errors import BackendUnavailableError, PoolMismatchError, UnsupportedLayoutError
from sgl_cuda import kvcacheio
from sgl_cuda._device_pool import CudaMLADevicePool

__all__ = ["CudaMLAHostPool"]


class _DeviceIndices:
    """Device copies of a validated load's indices, reused by the next layers' loads."""

    __slots__ = ("device", "device_indices", "event", "host_indices", "stream")

    def __init__(
        self,
        device: torch.device,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        stream: torch.cuda.Stream,
    ) -> None:
        self.device = device
        self.host_indices = host_indices
        self.device_indices = device_indices
        self.stream = stream
        self.event = stream.record_event()


def _upload(indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``indices`` on ``device``; from CPU through pinned memory, so the copy is async."""
    if indices.device == device:
        return indices.contiguous()
    if device.type == "cuda" and indices.device.type == "cpu" and not indices.is_pinned():
        indices = indices.pin_memory()
    return indices.to(device, non_blocking=True).contiguous()


class CudaMLAHostPool(TokenRowHostPool):
    """Host (L2) copy of a per-layer MLA device pool, for the ``cuda`` backend.

    ``data_refs`` are the per-layer host views (strided for ``page_first``) and
    ``data_ptrs`` a ``torch.uint64`` table of their addresses on the device
    pool's device. Host memory is pinned when CUDA is available, which the
    ``kernel`` io backend needs to reach it from the GPU.
    """

    supported_pairs: ClassVar[dict[HostLayout, frozenset[IOBackend]]] = {
        HostLayout.LAYER_FIRST: frozenset({IOBackend.KERNEL, IOBackend.DIRECT}),
        HostLayout.PAGE_FIRST: frozenset({IOBackend.KERNEL}),
        HostLayout.PAGE_FIRST_DIRECT: frozenset({IOBackend.DIRECT}),
    }

    data_refs: list[torch.Tensor]
    data_ptrs: torch.Tensor
    # Opt-in: per-layer loads of the same (already validated) indices reuse their
    # device copies. Off until it has run on a GPU (only a CUDA test covers it).
    reuse_index_uploads: bool = False

    def _allocate_buffers(self, device_pool: MLADevicePool) -> None:
        super()._allocate_buffers(device_pool)
        if self.layout is HostLayout.LAYER_FIRST:
            self.data_refs = [self.kv_buffer[i] for i in range(self.layer_num)]
        else:
            self.data_refs = [self.kv_buffer[:, i] for i in range(self.layer_num)]
        self._ptr_values = [ref.data_ptr() for ref in self.data_refs]
        self._ptr_tables: dict[torch.device, torch.Tensor] = {}
        self._pending: dict[int, torch.cuda.Event] = {}
        self.data_ptrs = self._host_table(device_pool.device)
        if (
            device_pool.device.type == "cuda"
            and not self.pin_memory
            and self.supported_pairs[self.layout] == frozenset({IOBackend.KERNEL})
        ):
            raise UnsupportedLayoutError(
                f"layout={self.layout.value!r} runs only the 'kernel' io backend, which "
                "reaches host memory from the GPU and needs it pinned (pin_memory=False given)"
            )

    def _host_table(self, device: torch.device) -> torch.Tensor:
        table = self._ptr_tables.get(device)
        if table is None:
            table = torch.tensor(self._ptr_values, dtype=torch.uint64, device=device)
            self._ptr_tables[device] = table
        return table

    # ---------------------------------------------------------- stream order
    def _queued(self, device_pool: MLADevicePool) -> None:
        """Remember the point on the current stream after the transfer just queued."""
        device = device_pool.device
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            # One event per stream: a write-back stream and a load stream both count.
            self._pending[stream.cuda_stream] = stream.record_event()

    def synchronize(self) -> None:
        """Wait until every transfer this pool queued, on any stream, has finished."""
        pending, self._pending = self._pending, {}
        for event in pending.values():
            event.synchronize()

    def backup_from_device_all_layer(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend | str,
    ) -> None:
        super().backup_from_device_all_layer(device_pool, host_indices, device_indices, io_backend)
        self._queued(device_pool)

    def load_to_device_per_layer(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: IOBackend | str,
    ) -> None:
        super().load_to_device_per_layer(
            device_pool, host_indices, device_indices, layer_id, io_backend
        )
        self._queued(device_pool)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        self.synchronize()
        return super().get_data_page(index, flat)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.synchronize()
        super().set_from_flat_data_page(index, data_page)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        self.synchronize()
        return super().get_page_buffer_meta(indices)

    # ------------------------------------------------------------- validation
    def _check_io_support(self, device_pool: MLADevicePool, io_backend: IOBackend) -> None:
        if io_backend is IOBackend.KERNEL:
            self._check_kernel_pool(device_pool)

    def _check_kernel_pool(self, device_pool: MLADevicePool) -> None:
        device = device_pool.device
        if device.type == "cuda":
            if not self.pin_memory:
                raise UnsupportedLayoutError(
                    "io_backend='kernel' reaches host memory from the GPU and needs it "
                    "pinned; this pool was built with pin_memory=False (use 'direct')"
                )
        elif not (device.type == "cpu" and kvcacheio.interpreter_active()):
            raise BackendUnavailableError(
                f"io_backend='kernel' needs a CUDA device pool (got {device}); CPU pools "
                "work only under TRITON_INTERPRET=1"
            )
        # Every layer, also of a CudaMLADevicePool: ``set_`` can make one strided.
        for i, layer in enumerate(device_layers(device_pool)):
            if not layer.is_contiguous() or layer.device != device:
                raise PoolMismatchError(
                    f"device_pool.kv_buffer[{i}] must be contiguous on {device} "
                    "for io_backend='kernel'"
                )

    # -------------------------------------------------------------- transfers
    def _device_table(self, device_pool: MLADevicePool) -> torch.Tensor:
        if isinstance(device_pool, CudaMLADevicePool):
            return device_pool.data_ptrs
        # A foreign per-layer pool (e.g. the torch backend's): build its table.
        ptrs = [t.data_ptr() for t in device_layers(device_pool)]
        return torch.tensor(ptrs, dtype=torch.uint64, device=device_pool.device)

    def _backup(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        io_backend: IOBackend,
    ) -> None:
        if io_backend is IOBackend.DIRECT:
            self._direct(device_pool, host_indices, device_indices, None, to_host=True)
            return
        device = device_pool.device
        h_idx, d_idx = _upload(host_indices, device), _upload(device_indices, device)
        item = self.shape.token_stride_size
        if self.layout is HostLayout.LAYER_FIRST:
            kvcacheio.transfer_kv_all_layer_mla(
                self._device_table(device_pool),
                self._host_table(device),
                d_idx,
                h_idx,
                item,
                self.layer_num,
            )
        else:
            kvcacheio.transfer_kv_all_layer_mla_lf_pf(
                self._device_table(device_pool),
                self.kv_buffer,
                d_idx,
                h_idx,
                item,
                self.shape.layout_dim,
                self.layer_num,
            )

    def _load(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int,
        io_backend: IOBackend,
    ) -> None:
        if io_backend is IOBackend.DIRECT:
            self._direct(device_pool, host_indices, device_indices, layer_id, to_host=False)
            return
        h_idx, d_idx = self._load_indices(device_pool.device, host_indices, device_indices)
        item = self.shape.token_stride_size
        dst = device_layers(device_pool)[layer_id]
        if self.layout is HostLayout.LAYER_FIRST:
            kvcacheio.transfer_kv_per_layer_mla(self.kv_buffer[layer_id], dst, h_idx, d_idx, item)
        else:
            kvcacheio.transfer_kv_per_layer_mla_pf_lf(
                self.kv_buffer, dst, h_idx, d_idx, layer_id, item, self.shape.layout_dim
            )

    def _load_indices(
        self, device: torch.device, host_indices: torch.Tensor, device_indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Device copies of a load's indices: uploaded once per validated call."""
        if device.type != "cuda":
            return _upload(host_indices, device), _upload(device_indices, device)
        stream = torch.cuda.current_stream(device)
        cached = self._cached_plan() if self.reuse_index_uploads else None
        if isinstance(cached, _DeviceIndices) and cached.device == device:
            if cached.stream != stream:
                # Uploaded on another stream: order after it, and keep the memory
                # alive until this stream is done with it.
                stream.wait_event(cached.event)
                cached.host_indices.record_stream(stream)
                cached.device_indices.record_stream(stream)
            return cached.host_indices, cached.device_indices
        h_idx, d_idx = _upload(host_indices, device), _upload(device_indices, device)
        if self.reuse_index_uploads:
            self._store_plan(_DeviceIndices(device, h_idx, d_idx, stream))
        return h_idx, d_idx

    def _direct(
        self,
        device_pool: MLADevicePool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        layer_id: int | None,
        *,
        to_host: bool,
    ) -> None:
        dev = device_layers(device_pool)
        ps = self.page_size
        if self.layout is HostLayout.LAYER_FIRST:
            host = self.data_refs if layer_id is None else [self.data_refs[layer_id]]
            device = dev if layer_id is None else [dev[layer_id]]
            if to_host:
                kvcacheio.transfer_kv_direct(device, host, device_indices, host_indices, ps)
            else:
                kvcacheio.transfer_kv_direct(host, device, host_indices, device_indices, ps)
        elif to_host:
            kvcacheio.transfer_kv_all_layer_direct_lf_pf(
                dev, [self.kv_buffer], device_indices, host_indices, ps
            )
        else:
            assert layer_id is not None
            kvcacheio.transfer_kv_per_layer_direct_pf_lf(
                [self.kv_buffer], [dev[layer_id]], host_indices, device_indices, layer_id, ps
            )
