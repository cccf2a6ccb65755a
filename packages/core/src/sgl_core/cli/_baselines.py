"""Reference transfers written the plain way, and the contiguous-copy limit.

``per_token``: per layer, one ``index_select`` on the source and one indexed
write (``index_copy_`` / ``index_put_``) on the destination, token by token.
``per_page``: per layer, a Python loop over pages with one slice copy each,
like the upstream engine's ``direct`` path. Both run on any pool pair through
the host pool's ``layer_views`` (``sgl_core.backend.LayerViews``): per layer,
``(device_rows, host_pages)`` per component.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sgl_core.kv.protocols._kv_protocols import MLADevicePool, MLAHostPool
from sgl_core.kv.protocols._protocols import LayerViews

__all__ = ["BASELINES", "Transfer", "contiguous_copy", "per_page", "per_token"]

Component = tuple[torch.Tensor, torch.Tensor]


class Transfer:
    """One batch: paired host/device token indices of whole pages."""

    def __init__(
        self,
        dev: MLADevicePool,
        host: MLAHostPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
    ) -> None:
        self.dev = dev
        self.host = host
        self.host_indices = host_indices
        self.device_indices = device_indices
        ps = host.page_size
        self.host_page = host_indices // ps
        self.host_offset = host_indices % ps
        if not isinstance(host, LayerViews):
            raise TypeError(f"{type(host).__name__} shows no layer views (layer_views)")
        self.layers: list[list[Component]] = [
            host.layer_views(dev, layer) for layer in range(dev.layer_num)
        ]
        self.page_pairs = list(
            zip(host_indices[::ps].tolist(), device_indices[::ps].tolist(), strict=True)
        )


def per_token(t: Transfer, *, to_host: bool, layer: int | None = None) -> None:
    """Per layer: gather the tokens with ``index_select``, scatter them one row each."""
    d_idx = t.device_indices.to(t.dev.device)
    layers = range(len(t.layers)) if layer is None else [layer]
    for lay in layers:
        for rows, pages in t.layers[lay]:
            if to_host:
                pages.index_put_((t.host_page, t.host_offset), rows.index_select(0, d_idx).cpu())
            else:
                rows.index_copy_(0, d_idx, pages[t.host_page, t.host_offset].to(rows.device))


def per_page(t: Transfer, *, to_host: bool, layer: int | None = None) -> None:
    """Per layer and page: one slice copy (the upstream ``direct`` loop)."""
    ps = t.host.page_size
    layers = range(len(t.layers)) if layer is None else [layer]
    for lay in layers:
        for rows, pages in t.layers[lay]:
            for h, d in t.page_pairs:
                if to_host:
                    pages[h // ps].copy_(rows[d : d + ps])
                else:
                    rows[d : d + ps].copy_(pages[h // ps])


BaselineFn = Callable[..., None]
BASELINES: dict[str, BaselineFn] = {"per_token": per_token, "per_page": per_page}


def contiguous_copy(
    nbytes: int, device: torch.device, *, pin: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(device_buf, host_buf)`` of ``nbytes`` each, touched, for the copy limit."""
    host_buf = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pin)
    dev_buf = torch.ones(nbytes, dtype=torch.uint8, device=device)
    return dev_buf, host_buf
