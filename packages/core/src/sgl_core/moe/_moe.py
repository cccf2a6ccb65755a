"""MoE combine of routed and shared experts, and the torch reference method.

The combine reads a capability attribute, never ``isinstance`` against method classes, so
this module imports no device package (docs/design.md sections 1 and 9).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from sgl_core.errors import (
    ArgumentTypeError,
    DeviceError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    ShapeMismatchError,
)

__all__ = [
    "MoEWeights",
    "TorchMoEMethod",
    "check_routing",
    "folds_routed_scale",
    "maybe_fuse_routed_scale_and_shared_add",
    "silu_and_mul",
]


def _capability(owner: object, name: str) -> bool:
    """A declared capability flag: absent is False; ``bool`` or numpy bool as given.

    Anything else (``1``, ``"yes"``, a tensor) is an ``ArgumentTypeError``:
    reading it as False would silently skip or double the routed scale.
    """
    value = getattr(owner, name, False)
    if isinstance(value, bool):
        return value
    # numpy scalar bools (``np.True_``) and 0-d bool arrays, without importing numpy
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind == "b" and getattr(value, "shape", None) == ():
        return bool(value)
    raise ArgumentTypeError(
        f"{type(owner).__name__}.{name} must be a bool, got {type(value).__name__} {value!r}"
    )


def _finite_real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ArgumentTypeError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def folds_routed_scale(experts: object) -> bool:
    """True when the experts' method leaves ``routed_scaling_factor`` to the combine.

    Rules: docs/design.md section 9; a non-bool attribute raises ``ArgumentTypeError``.
    """
    method = getattr(experts, "quant_method", experts)
    return _capability(method, "fuses_routed_scale_and_shared_add")


def maybe_fuse_routed_scale_and_shared_add(
    experts: object,
    routed: torch.Tensor,
    shared: torch.Tensor | None,
    routed_scaling_factor: float,
) -> torch.Tensor:
    """Combine routed and shared expert outputs in place (docs/design.md section 9).

    ``shared=None`` means no shared experts. Rejected before anything is
    written: ``routed`` not a floating-point tensor, ``shared`` neither a tensor nor None
    (``ArgumentTypeError``); ``shared`` of another shape, dtype or device
    (``ShapeMismatchError``); a ``routed_scaling_factor`` that is not a finite
    real number (``ArgumentTypeError``); a capability attribute that is not a
    bool (see :func:`folds_routed_scale`).
    """
    if not isinstance(routed, torch.Tensor):
        raise ArgumentTypeError(f"routed must be a torch.Tensor, got {type(routed).__name__}")
    if not routed.dtype.is_floating_point:
        raise ArgumentTypeError(f"routed must be floating point, got {routed.dtype}")
    if shared is not None and not isinstance(shared, torch.Tensor):
        raise ArgumentTypeError(
            f"shared must be a torch.Tensor or None, got {type(shared).__name__}"
        )
    if shared is not None and (
        shared.shape != routed.shape
        or shared.dtype != routed.dtype
        or shared.device != routed.device
    ):
        raise ShapeMismatchError(
            f"shared {tuple(shared.shape)}/{shared.dtype}/{shared.device} must match "
            f"routed {tuple(routed.shape)}/{routed.dtype}/{routed.device}"
        )
    factor = _finite_real(routed_scaling_factor, "routed_scaling_factor")
    if folds_routed_scale(experts):
        in_topk = _capability(experts, "should_fuse_routed_scaling_factor_in_topk")
        scale = 1.0 if in_topk else factor
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

    @property
    def hidden_size(self) -> int:
        return int(self.w13_weight.shape[2])


def check_routing(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    hidden_size: int,
) -> int:
    """The routing check every MoE method runs first; returns the token count.

    ``x (tokens, hidden_size)`` floating point; ``topk_ids (tokens, top_k)``
    int32/int64 in ``[0, num_experts)``; ``topk_weights`` floating, same shape;
    all on one device. ``tokens`` may be 0 (an expert-parallel rank that got
    none): methods then return ``x.new_zeros((0, hidden_size))``. Errors:
    ``ArgumentTypeError`` (not a tensor, non-float ``x``/``topk_weights``),
    ``ShapeMismatchError`` (``x`` shape or devices), ``IndexDTypeError``
    (``topk_ids`` dtype), ``IndexShapeError`` (routing shapes, ``top_k == 0``),
    ``IndexOutOfRangeError`` (an id outside ``[0, num_experts)``; reading the
    range costs one device synchronization), ``DeviceError`` (meta tensors).
    """
    for name, t in (("x", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not x.dtype.is_floating_point or not topk_weights.dtype.is_floating_point:
        raise ArgumentTypeError(
            f"x and topk_weights must be floating point, got {x.dtype} and {topk_weights.dtype}"
        )
    if x.dim() != 2 or x.shape[1] != hidden_size:
        raise ShapeMismatchError(f"x must be (tokens, hidden={hidden_size}), got {tuple(x.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise IndexDTypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if (
        topk_ids.dim() != 2
        or topk_ids.shape[0] != x.shape[0]
        or topk_ids.shape[1] == 0
        or topk_weights.shape != topk_ids.shape
    ):
        raise IndexShapeError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
            f"must both be (tokens={x.shape[0]}, top_k >= 1)"
        )
    if topk_ids.device != x.device or topk_weights.device != x.device:
        raise ShapeMismatchError(
            f"x ({x.device}), topk_weights ({topk_weights.device}) and topk_ids "
            f"({topk_ids.device}) must share a device"
        )
    if topk_ids.device.type == "meta":
        raise DeviceError("topk_ids is a meta tensor: it has no values to route with")
    if topk_ids.numel():
        low, high = (int(v) for v in torch.aminmax(topk_ids))
        if low < 0 or high >= num_experts:
            bad = low if low < 0 else high
            raise IndexOutOfRangeError(f"topk_ids holds {bad}, outside [0, {num_experts})")
    return int(x.shape[0])


class TorchMoEMethod:
    """Reference unquantized MoE; the combine folds its scale (docs/design.md section 9)."""

    fuses_routed_scale_and_shared_add: ClassVar[bool] = True

    def apply(
        self,
        layer: MoEWeights,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        if not check_routing(x, topk_weights, topk_ids, layer.num_experts, layer.hidden_size):
            return x.new_zeros((0, layer.hidden_size))
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
    from sgl_core.kv.protocols._protocols import MoEMethod

    _method: MoEMethod = TorchMoEMethod()
