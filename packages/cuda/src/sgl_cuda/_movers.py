"""The CUDA host pool's movers: ``KernelMover`` (Triton launches) and ``DirectMover``.

``kernel`` backs up every layer in one launch through the pointer tables
(device ``data_ptrs`` -> host ``data_ptrs`` for ``layer_first``, device
``data_ptrs`` -> page-first host base for ``page_first``) and loads one layer
per launch. ``direct`` merges index runs into slice copies through
``sgl_cuda.kvcacheio``'s direct functions. Both record the point after each
transfer in the pool's ``StreamFence``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sgl_core.backend import HostLayout, MLADevicePool, PlanCache, Transfer, device_layers
from sgl_core.errors import BackendUnavailableError, PoolMismatchError, UnsupportedLayoutError
from sgl_cuda import kvcacheio
from sgl_cuda._device_pool import CudaMLADevicePool

if TYPE_CHECKING:
    from sgl_cuda._host_pool import CudaMLAHostPool

__all__ = ["DirectMover", "KernelMover"]


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
    """``indices`` on ``device``; from CPU through a pinned snapshot, so the copy is async.

    Always a snapshot, also of an index tensor that is already pinned: the
    async copy must not read the caller's memory after this call returns (the
    caller may reuse its index tensor for the next batch at once).
    """
    if indices.device == device:
        return indices.contiguous()
    if device.type == "cuda" and indices.device.type == "cpu":
        snapshot = torch.empty(indices.shape, dtype=indices.dtype, pin_memory=True)
        indices = snapshot.copy_(indices)
    return indices.to(device, non_blocking=True).contiguous()


class KernelMover:
    """``kernel`` io: Triton launches through the layers' pointer tables."""

    def __init__(self, pool: CudaMLAHostPool) -> None:
        self.layout = pool.layout
        self.kv_buffer = pool.kv_buffer
        self.pin_memory = pool.pin_memory
        self.layer_num = pool.layer_num
        self.item = pool.shape.token_stride_size
        self.layout_dim = pool.shape.layout_dim
        self.fence = pool.fence
        self.host_table = pool.host_table
        # Opt-in: per-layer loads of the same (already validated) indices reuse their
        # device copies. Off until it has run on a GPU (only a CUDA test covers it).
        self.reuse_index_uploads = False
        self._uploads: PlanCache[_DeviceIndices] = PlanCache()

    def check(self, device_pool: MLADevicePool) -> None:
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

    def synchronize(self) -> None:
        self.fence.synchronize()

    def backup(self, transfer: Transfer) -> None:
        device_pool = transfer.device_pool
        device = device_pool.device
        h_idx = _upload(transfer.host_indices, device)
        d_idx = _upload(transfer.device_indices, device)
        if self.layout is HostLayout.LAYER_FIRST:
            kvcacheio.transfer_kv_all_layer_mla(
                _device_table(device_pool),
                self.host_table(device),
                d_idx,
                h_idx,
                self.item,
                self.layer_num,
            )
        else:
            kvcacheio.transfer_kv_all_layer_mla_lf_pf(
                _device_table(device_pool),
                self.kv_buffer,
                d_idx,
                h_idx,
                self.item,
                self.layout_dim,
                self.layer_num,
            )
        self.fence.record(device)

    def load(self, transfer: Transfer, layer_id: int) -> None:
        device = transfer.device_pool.device
        h_idx, d_idx = self._load_indices(transfer, device)
        dst = device_layers(transfer.device_pool)[layer_id]
        if self.layout is HostLayout.LAYER_FIRST:
            kvcacheio.transfer_kv_per_layer_mla(
                self.kv_buffer[layer_id], dst, h_idx, d_idx, self.item
            )
        else:
            kvcacheio.transfer_kv_per_layer_mla_pf_lf(
                self.kv_buffer, dst, h_idx, d_idx, layer_id, self.item, self.layout_dim
            )
        self.fence.record(device)

    def _load_indices(
        self, transfer: Transfer, device: torch.device
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
        self._uploads.put(transfer, _DeviceIndices(device, h_idx, d_idx, stream))
        return h_idx, d_idx


class DirectMover:
    """``direct`` io through ``sgl_cuda.kvcacheio``'s direct functions (slice copies)."""

    def __init__(self, pool: CudaMLAHostPool) -> None:
        self.layout = pool.layout
        self.kv_buffer = pool.kv_buffer
        self.data_refs = pool.data_refs
        self.page_size = pool.page_size
        self.fence = pool.fence

    def check(self, device_pool: MLADevicePool) -> None:
        """Slice copies run with any per-layer device pool the host pool accepted."""

    def synchronize(self) -> None:
        self.fence.synchronize()

    def backup(self, transfer: Transfer) -> None:
        dev = device_layers(transfer.device_pool)
        h_idx, d_idx, ps = transfer.host_indices, transfer.device_indices, self.page_size
        if self.layout is HostLayout.LAYER_FIRST:
            kvcacheio.transfer_kv_direct(dev, self.data_refs, d_idx, h_idx, ps)
        else:
            kvcacheio.transfer_kv_all_layer_direct_lf_pf(dev, [self.kv_buffer], d_idx, h_idx, ps)
        self.fence.record(transfer.device_pool.device)

    def load(self, transfer: Transfer, layer_id: int) -> None:
        dst = [device_layers(transfer.device_pool)[layer_id]]
        h_idx, d_idx, ps = transfer.host_indices, transfer.device_indices, self.page_size
        if self.layout is HostLayout.LAYER_FIRST:
            kvcacheio.transfer_kv_direct([self.data_refs[layer_id]], dst, h_idx, d_idx, ps)
        else:
            kvcacheio.transfer_kv_per_layer_direct_pf_lf(
                [self.kv_buffer], dst, h_idx, d_idx, layer_id, ps
            )
        self.fence.record(transfer.device_pool.device)


def _device_table(device_pool: MLADevicePool) -> torch.Tensor:
    if isinstance(device_pool, CudaMLADevicePool):
        return device_pool.data_ptrs
    # A foreign per-layer pool (e.g. the torch backend's): build its table.
    ptrs = [t.data_ptr() for t in device_layers(device_pool)]
    return torch.tensor(ptrs, dtype=torch.uint64, device=device_pool.device)
