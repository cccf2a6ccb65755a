"""The cuda host pools' ``direct`` mover, one for every kind of KV rows.

``CudaDirectMover`` is the core ``DirectMover`` (slice copies, built from the
``HostSide``) recording the point after each transfer in the pool's
``StreamFence``. With ``SGL_CUDA_DIRECT_COPY=batch`` (opt-in,
``sgl_cuda._copy_engine``) a ``layer_first`` or ``page_first_direct``
transfer first tries one batched copy-engine call over every part; where the
engine declines, nothing was copied and the slice copies run.
"""

from __future__ import annotations

from typing import Any

import torch

from sgl_core.backend import DirectMover, HostLayout, HostSide, Transfer
from sgl_cuda import _copy_engine
from sgl_cuda._stream_fence import StreamFence

__all__ = ["CudaDirectMover"]

# The layouts whose host rows the copy engine's entry points address.
_BATCHED = (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST_DIRECT)


class CudaDirectMover(DirectMover):
    """``direct`` io (core slice copies), recording each transfer in the pool's fence."""

    def __init__(self, host: HostSide, fence: StreamFence | None = None) -> None:
        super().__init__(host)
        self.fence = StreamFence() if fence is None else fence
        # Rows kept on a layer subset (the DSA indexer) are addressed by slot, which
        # the copy engine's per-layer entry points do not know: the slices move them.
        self._subset = any(p.component.layers is not None for p in self.parts)

    def synchronize(self) -> None:
        self.fence.synchronize()

    def backup(self, transfer: Transfer[Any]) -> None:
        if not self._batched(transfer, None):
            super().backup(transfer)
        self.fence.record(transfer.device_pool.device)

    def load(self, transfer: Transfer[Any], layer_id: int) -> None:
        if not self._batched(transfer, layer_id):
            super().load(transfer, layer_id)
        self.fence.record(transfer.device_pool.device)

    def _batched(self, transfer: Transfer[Any], layer_id: int | None) -> bool:
        """One batched copy-engine call (opt-in), or False with nothing copied."""
        mode = _copy_engine.resolve_mode(None)
        if mode == "foreach" or self.layout not in _BATCHED or self._subset:
            return False
        pool = transfer.device_pool
        h_idx, d_idx = transfer.host_indices.cpu(), transfer.device_indices.cpu()
        every = range(self.layer_num) if layer_id is None else range(layer_id, layer_id + 1)
        devs = [[getattr(pool, p.component.device_name)[r] for r in every] for p in self.parts]
        if self.layout is HostLayout.PAGE_FIRST_DIRECT:
            rows = torch.arange(every.start, every.stop, dtype=torch.int64)
            parts = [(p.buffer, rows, d) for p, d in zip(self.parts, devs, strict=True)]
            return _copy_engine.page_first(
                parts, h_idx, d_idx, self.unit, mode, to_host=layer_id is None
            )
        hosts = [self.facts.row(p.buffer, r) for p in self.parts for r in every]
        flat = [t for d in devs for t in d]
        short = self._tuning(pool).gather_below_run_bytes
        if layer_id is None:
            return _copy_engine.layer_first(flat, hosts, d_idx, h_idx, mode, short)
        return _copy_engine.layer_first(hosts, flat, h_idx, d_idx, mode, short)
