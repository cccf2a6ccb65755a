"""MoE combine of routed and shared experts, and the torch reference method.

The combine decides by a capability attribute on the method
(``fuses_routed_scale_and_shared_add``), never by ``isinstance`` against
method classes: that is what lets this module import no device package.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from sgl_core.errors import ShapeMismatchError

__all__ = [
    "MoEWeights",
    "TorchMoEMethod",
    "folds_routed_scale",
    "maybe_fuse_routed_scale_and_shared_add",
    "silu_and_mul",
]


def folds_routed_scale(experts: object) -> bool:
    """True when the experts' method leaves ``routed_scaling_factor`` to the combine.

    ``experts`` is a module holding ``quant_method`` or a method itself; a
    method without the attribute counts as not folding.
    """
    method = getattr(experts, "quant_method", experts)
    return getattr(method, "fuses_routed_scale_and_shared_add", False) is True


def maybe_fuse_routed_scale_and_shared_add(
    experts: object,
    routed: torch.Tensor,
    shared: torch.Tensor | None,
    routed_scaling_factor: float,
) -> torch.Tensor:
    """Combine routed and shared expert outputs in place (DESIGN §5).

    * Methods that fold the scale: ``shared.add_(routed, alpha=s)`` when
      ``shared`` is given (returns ``shared``), else ``routed.mul_(s)``;
      ``s`` is 1.0 when ``experts.should_fuse_routed_scaling_factor_in_topk``
      says the scale is already inside the top-k weights.
    * Other methods already scaled ``routed``: ``routed.add_(shared)`` or ``routed``.
    """
    if shared is not None and (shared.shape != routed.shape or shared.dtype != routed.dtype):
        raise ShapeMismatchError(
            f"shared {tuple(shared.shape)}/{shared.dtype} must match "
            f"routed {tuple(routed.shape)}/{routed.dtype}"
        )
    if folds_routed_scale(experts):
        in_topk = getattr(experts, "should_fuse_routed_scaling_factor_in_topk", False) is True
        scale = 1.0 if in_topk else float(routed_scaling_factor)
        if shared is not None:
            return shared.add_(routed, alpha=scale)
        return routed.mul_(scale)
    if shared is not None:
        return routed.add_(shared)
    return routed


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` on the last dim."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclasses.dataclass
class MoEWeights:
    """Unquantized experts: ``w13_weight (E, 2*I, H)``, ``w2_weight (E, H, I)``."""

    w13_weight: torch.Tensor
    w2_weight: torch.Tensor

    def __post_init__(self) -> None:
        e, two_i, h = self.w13_weight.shape
        if two_i % 2 or tuple(self.w2_weight.shape) != (e, h, two_i // 2):
            raise ShapeMismatchError(
                f"w13_weight {tuple(self.w13_weight.shape)} and w2_weight "
                f"{tuple(self.w2_weight.shape)} are not (E, 2I, H) and (E, H, I)"
            )

    @property
    def num_experts(self) -> int:
        return int(self.w13_weight.shape[0])


def check_routing(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int
) -> None:
    """Shapes and id range of a routing decision for ``x (tokens, hidden)``."""
    if x.dim() != 2:
        raise ShapeMismatchError(f"x must be (tokens, hidden), got {tuple(x.shape)}")
    if (
        topk_ids.shape != topk_weights.shape
        or topk_ids.dim() != 2
        or topk_ids.shape[0] != x.shape[0]
    ):
        raise ShapeMismatchError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
            f"must both be (tokens={x.shape[0]}, top_k)"
        )
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ShapeMismatchError(f"topk_ids must lie in [0, {num_experts})")


class TorchMoEMethod:
    """Reference unquantized MoE: gate_up -> SiLU-and-mul -> down -> weighted top-k sum.

    It does not apply ``routed_scaling_factor``; the combine folds it.
    """

    fuses_routed_scale_and_shared_add: ClassVar[bool] = True

    def apply(
        self,
        layer: MoEWeights,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        check_routing(x, topk_weights, topk_ids, layer.num_experts)
        tokens, top_k = topk_ids.shape
        flat_ids = topk_ids.reshape(-1).to(torch.int64)
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=layer.num_experts).tolist()
        out = torch.zeros((tokens * top_k, x.shape[1]), dtype=torch.float32, device=x.device)
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            slots = order[start : start + count]
            start += count
            h = x[slots // top_k].float()
            inter = silu_and_mul(h @ layer.w13_weight[expert].float().t())
            out[slots] = inter @ layer.w2_weight[expert].float().t()
        weighted = out.view(tokens, top_k, -1) * topk_weights.float().unsqueeze(-1)
        return weighted.sum(dim=1).to(x.dtype)


if TYPE_CHECKING:
    from sgl_core._protocols import MoEMethod

    _method: MoEMethod = TorchMoEMethod()
