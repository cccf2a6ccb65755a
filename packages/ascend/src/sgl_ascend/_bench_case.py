"""The Ascend W8A8 method as an ``sgl-bench moe`` case (entry point ``sgl.moe_bench_cases``)."""

from __future__ import annotations

import torch

from sgl_ascend._moe import AscendW8A8DynamicMoEMethod, W8A8MoEWeights
from sgl_core import MoEWeights
from sgl_core.backend import MoEBenchCase
from sgl_core.errors import BackendUnavailableError

__all__ = ["w8a8_dynamic_case"]


def w8a8_dynamic_case(device: torch.device, small: bool) -> MoEBenchCase:
    """Int8 per-channel experts with per-token dynamic int8 activations."""
    if device.type not in ("cpu", "npu"):
        raise BackendUnavailableError(f"the Ascend MoE method runs on npu (or cpu), not {device}")
    hidden, inter, experts = (256, 128, 8) if small else (1024, 512, 16)
    gen = torch.Generator().manual_seed(3)
    dense = MoEWeights(
        (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(device),
        (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(device),
    )
    quantized = W8A8MoEWeights.quantize(dense)
    reference = quantized.dequantize(torch.float32)
    # Per-token int8 activations: each element is off by up to amax/254 before
    # the products, so the max error can reach a few percent of the peak.
    return MoEBenchCase(
        "ascend_w8a8_dynamic", AscendW8A8DynamicMoEMethod(), quantized, reference, tolerance=6e-2
    )
