"""A DeepSeek-style MoE layer with the engine's own quant method.

The engine's method class satisfies ``sgl_core.MoEMethod`` structurally (no
inheritance), declares ``fuses_routed_scale_and_shared_add`` as a ``ClassVar``,
and the layer hands itself (an ``MoEExperts``) to the shared combine. No device
package is imported: this is the code path that broke upstream.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from sgl_core import (
    MoEExperts,
    MoEMethod,
    MoEWeights,
    TorchMoEMethod,
    maybe_fuse_routed_scale_and_shared_add,
    silu_and_mul,
)


class EngineDenseMoEMethod:
    """The engine's own method: it applies ``routed_scaling_factor`` itself."""

    fuses_routed_scale_and_shared_add: ClassVar[bool] = False

    def __init__(self, routed_scaling_factor: float) -> None:
        self.routed_scaling_factor = routed_scaling_factor

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        weights: MoEWeights = layer
        out = torch.zeros_like(x, dtype=torch.float32)
        for k in range(topk_ids.shape[1]):
            for t in range(x.shape[0]):
                e = int(topk_ids[t, k])
                h = silu_and_mul(x[t].float() @ weights.w13_weight[e].float().t())
                out[t] += topk_weights[t, k].float() * (h @ weights.w2_weight[e].float().t())
        return (out * self.routed_scaling_factor).to(x.dtype)


class DeepseekMoELayer:
    """Routed experts through any ``MoEMethod`` plus a shared-expert output."""

    def __init__(
        self, weights: MoEWeights, method: MoEMethod, routed_scaling_factor: float
    ) -> None:
        self.weights = weights
        self._method = method
        self.routed_scaling_factor = routed_scaling_factor
        self.should_fuse_routed_scaling_factor_in_topk = False

    @property
    def quant_method(self) -> MoEMethod:
        return self._method

    def forward(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_output: torch.Tensor | None,
    ) -> torch.Tensor:
        routed = self.quant_method.apply(self.weights, x, topk_weights, topk_ids)
        experts: MoEExperts = self
        return maybe_fuse_routed_scale_and_shared_add(
            experts, routed, shared_output, self.routed_scaling_factor
        )


def folds_scale(method: MoEMethod) -> bool:
    """The capability attribute, read from the class as the protocol declares it."""
    return type(method).fuses_routed_scale_and_shared_add


def demo() -> None:
    """Both kinds of method give the same combined output."""
    torch.manual_seed(0)
    e, hidden, inter, tokens, top_k, scale = 4, 16, 8, 5, 2, 2.5
    weights = MoEWeights(
        w13_weight=torch.randn(e, 2 * inter, hidden), w2_weight=torch.randn(e, hidden, inter)
    )
    x = torch.randn(tokens, hidden)
    topk_ids = torch.randint(0, e, (tokens, top_k))
    topk_weights = torch.softmax(torch.randn(tokens, top_k), dim=-1)
    shared = torch.randn(tokens, hidden)

    methods: list[MoEMethod] = [EngineDenseMoEMethod(scale), TorchMoEMethod()]
    assert [folds_scale(m) for m in methods] == [False, True]
    outs = [
        DeepseekMoELayer(weights, m, scale).forward(x, topk_weights, topk_ids, shared.clone())
        for m in methods
    ]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
