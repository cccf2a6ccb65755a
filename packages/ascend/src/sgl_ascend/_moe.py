"""Ascend MoE methods: unquantized grouped experts and W8A8 dynamic.

Both sort the (token, expert) slots by expert and run gate_up, SiLU-and-mul
and down as grouped matmuls: ``torch_npu.npu_grouped_matmul`` on an NPU
(through ``sgl_ascend._npu``), elsewhere float32 torch matmuls, one per
expert that received tokens. ``apply`` returns the *unscaled* routed sum
(``fuses_routed_scale_and_shared_add = True``): core's
``maybe_fuse_routed_scale_and_shared_add`` folds ``routed_scaling_factor``
into the shared-expert add.

W8A8 dynamic: int8 weights with one float32 scale per output channel
(:class:`W8A8MoEWeights`, build with :meth:`W8A8MoEWeights.quantize`);
activations are quantized per token at run time, symmetric,
``scale = amax(|x_t|) / 127``, ``q = round(x_t / scale)``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

import torch

from sgl_ascend import _npu
from sgl_core import MoEWeights, silu_and_mul
from sgl_core.backend import check_routing
from sgl_core.errors import ShapeMismatchError

__all__ = [
    "AscendMoEMethod",
    "AscendW8A8DynamicMoEMethod",
    "W8A8MoEWeights",
    "quantize_per_channel",
    "quantize_per_token",
]

_INT8_MAX = 127.0


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of ``x (T, K)``: ``(q int8 (T, K), scale float32 (T,))``."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / _INT8_MAX
    q = torch.round(xf / scale.unsqueeze(-1)).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return q, scale


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel of ``w (E, N, K)``: ``(q (E, N, K), scale (E, N))``."""
    return quantize_per_token(w)  # the same int8 of each last-dim row


@dataclasses.dataclass
class W8A8MoEWeights:
    """int8 experts ``w13_weight (E, 2I, H)``, ``w2_weight (E, H, I)`` with per-channel scales.

    ``w13_weight_scale (E, 2I)`` and ``w2_weight_scale (E, H)`` are float32;
    ``dequantize()`` gives ``q * scale`` as an unquantized :class:`MoEWeights`.
    """

    w13_weight: torch.Tensor
    w13_weight_scale: torch.Tensor
    w2_weight: torch.Tensor
    w2_weight_scale: torch.Tensor

    def __post_init__(self) -> None:
        MoEWeights(self.w13_weight, self.w2_weight)  # shape checks
        for name in ("w13_weight", "w2_weight"):
            if getattr(self, name).dtype != torch.int8:
                raise ShapeMismatchError(f"{name} must be torch.int8")
        for name, weight in (("w13", self.w13_weight), ("w2", self.w2_weight)):
            scale = getattr(self, f"{name}_weight_scale")
            if tuple(scale.shape) != tuple(weight.shape[:2]):
                raise ShapeMismatchError(
                    f"{name}_weight_scale must have shape {tuple(weight.shape[:2])}, "
                    f"got {tuple(scale.shape)}"
                )

    @classmethod
    def quantize(cls, weights: MoEWeights) -> W8A8MoEWeights:
        """Per-output-channel symmetric int8 quantization of unquantized experts."""
        w13, s13 = quantize_per_channel(weights.w13_weight)
        w2, s2 = quantize_per_channel(weights.w2_weight)
        return cls(w13, s13, w2, s2)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> MoEWeights:
        return MoEWeights(
            (self.w13_weight.float() * self.w13_weight_scale.unsqueeze(-1)).to(dtype),
            (self.w2_weight.float() * self.w2_weight_scale.unsqueeze(-1)).to(dtype),
        )

    @property
    def num_experts(self) -> int:
        return int(self.w13_weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.w13_weight.shape[2])


@dataclasses.dataclass(frozen=True)
class _Groups:
    """(token, expert) slots sorted by expert: ``order`` into the flat slots, per-expert counts."""

    order: torch.Tensor
    counts: torch.Tensor
    top_k: int

    @classmethod
    def of(cls, topk_ids: torch.Tensor, num_experts: int) -> _Groups:
        flat = topk_ids.reshape(-1).to(torch.int64)
        order = torch.argsort(flat, stable=True)
        return cls(order, torch.bincount(flat, minlength=num_experts), int(topk_ids.shape[1]))

    def bounds(self) -> list[tuple[int, int, int]]:
        """``(expert, start, end)`` row ranges of experts that received slots."""
        ends = torch.cumsum(self.counts, 0).tolist()
        starts = [0, *ends[:-1]]
        return [(e, s, t) for e, (s, t) in enumerate(zip(starts, ends, strict=True)) if t > s]

    def combine(
        self, rows: torch.Tensor, topk_weights: torch.Tensor, out_dtype: torch.dtype
    ) -> torch.Tensor:
        """Un-sort ``rows`` and return the top-k weighted sum per token."""
        unsorted = torch.empty_like(rows)
        unsorted[self.order] = rows
        tokens = topk_weights.shape[0]
        weighted = unsorted.view(tokens, self.top_k, -1).float() * topk_weights.float()[..., None]
        return weighted.sum(dim=1).to(out_dtype)


def _grouped(
    x: torch.Tensor,
    layer: MoEWeights | W8A8MoEWeights,
    name: str,
    groups: _Groups,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``x_rows @ weight[e].T`` per expert group, of ``layer``'s ``{name}_weight``.

    W8A8 weights (a ``{name}_weight_scale``): ``x`` quantized per token first
    (a row's own scale, so before or after the gather agrees), both scales applied.
    """
    weight = getattr(layer, f"{name}_weight")
    weight_scale: torch.Tensor | None = getattr(layer, f"{name}_weight_scale", None)
    row_scale = None
    if weight_scale is not None:
        x, row_scale = quantize_per_token(x)
    if x.device.type == "npu":
        scale_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
        return _npu.grouped_matmul(
            x,
            weight.transpose(1, 2),
            torch.cumsum(groups.counts, 0),
            output_dtype=dtype,
            scale=None if weight_scale is None else weight_scale.to(scale_dtype),
            per_token_scale=row_scale,
        )
    out = torch.empty((x.shape[0], weight.shape[1]), dtype=torch.float32, device=x.device)
    for expert, start, end in groups.bounds():
        acc = x[start:end].float() @ weight[expert].float().t()
        if weight_scale is not None:
            acc = acc * weight_scale[expert].float()
        out[start:end] = acc
    return out if row_scale is None else out * row_scale.unsqueeze(-1)


LayerT = TypeVar("LayerT", MoEWeights, W8A8MoEWeights)


class _GroupedMoEMethod(Generic[LayerT]):
    """Both methods: the weights (``LayerT``) say the quantization."""

    fuses_routed_scale_and_shared_add: ClassVar[bool] = True

    def apply(
        self,
        layer: LayerT,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Unscaled routed output ``(tokens, hidden)`` in ``x.dtype``."""
        if not check_routing(x, topk_weights, topk_ids, layer.num_experts, layer.hidden_size):
            return x.new_zeros((0, layer.hidden_size))
        groups = _Groups.of(topk_ids, layer.num_experts)
        gate_up = _grouped(x[groups.order // groups.top_k], layer, "w13", groups, x.dtype)
        down = _grouped(silu_and_mul(gate_up), layer, "w2", groups, x.dtype)
        return groups.combine(down, topk_weights, x.dtype)


class AscendMoEMethod(_GroupedMoEMethod[MoEWeights]):
    """Unquantized (bf16/fp16/fp32) grouped experts on :class:`sgl_core.MoEWeights`."""


class AscendW8A8DynamicMoEMethod(_GroupedMoEMethod[W8A8MoEWeights]):
    """W8A8 dynamic: int8 per-channel weights, per-token dynamic int8 activations."""


if TYPE_CHECKING:
    from sgl_core import MoEMethod

    _m: MoEMethod = AscendMoEMethod()
    _q: MoEMethod = AscendW8A8DynamicMoEMethod()
