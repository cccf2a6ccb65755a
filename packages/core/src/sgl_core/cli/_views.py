"""Uniform per-layer views of device and host pools, for baselines and checks.

Every supported pool pair is seen as, per layer, a list of components
``(device_rows, host_pages)`` (see ``sgl_core.backend.LayerViews``); the host
pool supplies them, so this module knows no pool's attributes.
"""

from __future__ import annotations

import torch

from sgl_core.kv.protocols._kv_protocols import MLADevicePool, MLAHostPool
from sgl_core.kv.protocols._protocols import LayerViews

__all__ = ["Component", "layer_components"]

Component = tuple[torch.Tensor, torch.Tensor]


def layer_components(dev: MLADevicePool, host: MLAHostPool, layer: int) -> list[Component]:
    """``(device_rows, host_pages)`` per component of ``layer``."""
    if not isinstance(host, LayerViews):
        raise TypeError(f"{type(host).__name__} shows no layer views (layer_views)")
    return host.layer_views(dev, layer)
