"""Uniform per-layer views of device and host pools, for baselines and checks.

Every supported pool pair is seen as, per layer, a list of components
``(device_rows, host_pages)``: ``device_rows (slots, dim)`` addressed by
device token index, ``host_pages (host_pages, page_size, dim)`` addressed by
``(host_index // page_size, host_index % page_size)``. Per-layer device pools
(torch, cuda) have one component of ``kv_cache_dim``; contiguous multi-layer
pools (ascend) have ``k`` and ``v``.
"""

from __future__ import annotations

import torch

from sgl_core._enums import HostLayout
from sgl_core._protocols import MLADevicePool, MLAHostPool

__all__ = ["Component", "layer_components"]

Component = tuple[torch.Tensor, torch.Tensor]


def _tensor(obj: object, name: str) -> torch.Tensor:
    value = getattr(obj, name, None)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{type(obj).__name__}.{name} is not a tensor")
    return value


def _device_rows(dev: MLADevicePool, layer: int) -> list[torch.Tensor]:
    per_layer = getattr(dev, "kv_buffer", None)
    if isinstance(per_layer, list):
        buf = per_layer[layer]
        assert isinstance(buf, torch.Tensor)
        return [buf.view(buf.shape[0], -1)]
    k = _tensor(dev, "k_buffer")[layer]
    v = _tensor(dev, "v_buffer")[layer]
    return [k.reshape(-1, k.shape[-1]), v.reshape(-1, v.shape[-1])]


def _host_pages(host: MLAHostPool, layer: int) -> list[torch.Tensor]:
    ps = host.page_size
    pages = host.size // ps
    if host.layout is HostLayout.PAGE_FIRST_KV_SPLIT:
        return [
            _tensor(host, "k_buffer")[:, layer, :, 0],
            _tensor(host, "v_buffer")[:, layer, :, 0],
        ]
    buf = _tensor(host, "kv_buffer")
    if host.layout is HostLayout.LAYER_FIRST:
        return [buf[layer, :, 0].view(pages, ps, -1)]
    if host.layout is HostLayout.PAGE_FIRST:
        return [buf[:, layer, 0].view(pages, ps, -1)]
    return [buf[:, layer, :, 0]]


def layer_components(dev: MLADevicePool, host: MLAHostPool, layer: int) -> list[Component]:
    """``(device_rows, host_pages)`` per component of ``layer``."""
    rows = _device_rows(dev, layer)
    pages = _host_pages(host, layer)
    if len(rows) != len(pages):
        raise TypeError(f"{type(dev).__name__} and {type(host).__name__} disagree on components")
    return list(zip(rows, pages, strict=True))
