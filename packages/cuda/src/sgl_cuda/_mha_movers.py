"""The movers of ``CudaMHAHostPool``: Triton launches (``kernel``) and slice copies (``direct``).

``MHAKernelMover`` runs ``sgl_cuda.kvcacheio``'s MHA functions: a backup is
one launch over every layer of K and V (device pointer tables to the host's
tables for ``layer_first``, to the host bases for ``page_first`` and
``page_head``); a load is one launch for one layer. When V rows are narrower
or wider than K rows (``v_head_dim != head_dim``) each component is its own
launch, since a launch moves rows of one width.

``MHACudaDirectMover`` is the core ``DirectMover``. Both record the point
after each transfer in the pool's ``StreamFence``, so the pool's host-side
readers (the L3 page helpers) wait for queued copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sgl_core.backend import DirectMover, HostLayout, MHADevicePool, Transfer, mha_device_layers
from sgl_core.errors import BackendUnavailableError, PoolMismatchError, UnsupportedLayoutError
from sgl_cuda import kvcacheio
from sgl_cuda._kvcacheio_mha import RowForm, prepare_rows
from sgl_cuda._mha_device_pool import CudaMHADevicePool

if TYPE_CHECKING:
    from sgl_cuda._mha_host_pool import CudaMHAHostPool

__all__ = ["MHACudaDirectMover", "MHAKernelMover"]


def _on_device(indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``indices`` on ``device``; from CPU through a pinned snapshot, so the copy is async.

    A snapshot even of pinned input: the async copy must not read the
    caller's tensor after this returns (it may be reused for the next batch).
    """
    if indices.device == device:
        return indices.contiguous()
    if device.type == "cuda" and indices.device.type == "cpu":
        indices = torch.empty(indices.shape, dtype=indices.dtype, pin_memory=True).copy_(indices)
    return indices.to(device, non_blocking=True).contiguous()


def _tables(device_pool: MHADevicePool) -> tuple[torch.Tensor, torch.Tensor]:
    """The device pool's K and V pointer tables (built here for a foreign per-layer pool)."""
    if isinstance(device_pool, CudaMHADevicePool):
        return device_pool.k_data_ptrs, device_pool.v_data_ptrs
    k, v = mha_device_layers(device_pool)

    def table(layers: list[torch.Tensor]) -> torch.Tensor:
        ptrs = [t.data_ptr() for t in layers]
        return torch.tensor(ptrs, dtype=torch.uint64, device=device_pool.device)

    return table(k), table(v)


class MHAKernelMover:
    """``kernel`` io for ``layer_first``, ``page_first`` and ``page_head``."""

    def __init__(self, pool: CudaMHAHostPool) -> None:
        self.layout = pool.layout
        self.hosts = (pool.k_buffer, pool.v_buffer)
        self.rows = (pool.shape.k_row_bytes, pool.shape.v_row_bytes)
        self.layer_num = pool.layer_num
        self.page_size = pool.page_size
        self.head_num = pool.head_num
        self.pin_memory = pool.pin_memory
        self.fence = pool.fence
        self.host_tables = pool.host_tables

    def check(self, device_pool: MHADevicePool) -> None:
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
        # The kernels step rows by the row size and move int64 words: every layer
        # must be dense (``set_`` can make one strided), start on an 8-byte
        # boundary and be on the pool's device.
        for name, layers in zip(
            ("k_buffer", "v_buffer"), mha_device_layers(device_pool), strict=True
        ):
            for i, layer in enumerate(layers):
                if not layer.is_contiguous() or layer.device != device or layer.data_ptr() % 8:
                    raise PoolMismatchError(
                        f"device_pool.{name}[{i}] must be contiguous on {device} and start "
                        "on an 8-byte boundary for io_backend='kernel'"
                    )

    def synchronize(self) -> None:
        self.fence.synchronize()

    def _form(self, c: int, side: str, layer_view: bool) -> RowForm:
        """How the host side of component ``c`` addresses rows (``layer_view``: one layer)."""
        dim = self.rows[c] * self.layer_num
        if self.layout is HostLayout.LAYER_FIRST:
            return RowForm("layer_first" if layer_view else "table", side)
        if self.layout is HostLayout.PAGE_FIRST:
            return RowForm("page_first", side, dim)
        return RowForm("page_head", side, dim, self.page_size, self.head_num)

    def backup(self, transfer: Transfer[MHADevicePool]) -> None:
        device = transfer.device_pool.device
        h_idx = _on_device(transfer.host_indices, device)
        d_idx = _on_device(transfer.device_indices, device)
        src = _tables(transfer.device_pool)
        if self.layout is HostLayout.LAYER_FIRST:
            dst: tuple[torch.Tensor, torch.Tensor] = self.host_tables(device)
        else:
            dst = self.hosts
        self._launch(src, dst, d_idx, h_idx, RowForm("table", "src"), host_side="dst")
        self.fence.record(device)

    def load(self, transfer: Transfer[MHADevicePool], layer_id: int) -> None:
        device = transfer.device_pool.device
        h_idx = _on_device(transfer.host_indices, device)
        d_idx = _on_device(transfer.device_indices, device)
        k, v = mha_device_layers(transfer.device_pool)
        if self.layout is HostLayout.LAYER_FIRST:
            src = (self.hosts[0][layer_id], self.hosts[1][layer_id])
            offset = 0  # a layer's own rows
        else:
            src = self.hosts
            offset = layer_id
        dst = (k[layer_id], v[layer_id])
        self._launch(
            src, dst, h_idx, d_idx, RowForm("layer_first", "dst"), host_side="src", layer=offset
        )
        self.fence.record(device)

    def _launch(
        self,
        src: tuple[torch.Tensor, torch.Tensor],
        dst: tuple[torch.Tensor, torch.Tensor],
        src_idx: torch.Tensor,
        dst_idx: torch.Tensor,
        device_form: RowForm,
        *,
        host_side: str,
        layer: int | None = None,
    ) -> None:
        """K and V in one launch when their rows are equally wide, else one launch each.

        Both launches are checked before the first runs: a refused V never
        leaves K moved.
        """
        per_layer = layer is not None
        layers = 1 if per_layer else self.layer_num
        offset = layer or 0
        same = self.rows[0] == self.rows[1]
        launches: list[Callable[[], None]] = []
        for comps in ((0, 1),) if same else ((0,), (1,)):
            host_form = self._form(comps[0], host_side, layer_view=per_layer)
            forms = (host_form, device_form) if host_side == "src" else (device_form, host_form)
            launch = prepare_rows(
                tuple(src[c] for c in comps),
                tuple(dst[c] for c in comps),
                src_idx,
                dst_idx,
                item_size=self.rows[comps[0]],
                src_form=forms[0],
                dst_form=forms[1],
                layer_offset=offset,
                num_layers=layers,
            )
            launches.append(launch)
        for launch in launches:
            launch()


class MHACudaDirectMover(DirectMover):
    """``direct`` io (core slice copies), recording each transfer in the pool's fence."""

    def __init__(self, pool: CudaMHAHostPool) -> None:
        super().__init__(pool.host_side)
        self.fence = pool.fence

    def synchronize(self) -> None:
        self.fence.synchronize()

    def backup(self, transfer: Transfer[MHADevicePool]) -> None:
        super().backup(transfer)
        self.fence.record(transfer.device_pool.device)

    def load(self, transfer: Transfer[MHADevicePool], layer_id: int) -> None:
        super().load(transfer, layer_id)
        self.fence.record(transfer.device_pool.device)
