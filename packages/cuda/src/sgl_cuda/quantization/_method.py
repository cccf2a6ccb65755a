"""The GGML (GGUF-quantized) fused-MoE method (docs/design.md, section 9)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from sgl_core.backend import check_routing
from sgl_core.errors import ArgumentTypeError, ShapeMismatchError
from sgl_cuda.quantization._align import moe_align_block_size
from sgl_cuda.quantization._ops import (
    _check_tile,
    ggml_moe_a8,
    ggml_moe_a8_vec,
    ggml_moe_get_block_size,
)
from sgl_cuda.quantization._types import GGMLQuantType, block_format, resolve_quant_type

__all__ = ["GGMLExpertBank", "GGMLMoEMethod"]


@dataclass(frozen=True, eq=False)
class GGMLExpertBank:
    """One MoE layer's experts as GGUF block bytes.

    ``gate_up (E, 2*I, row_bytes(H))`` holds each expert's gate rows then its
    up rows; ``down (E, H, row_bytes(I))``. Types are GGML type ids (ints are
    accepted and normalized to :class:`GGMLQuantType`). Construction checks
    that the two banks agree on E, H and I.
    """

    gate_up: torch.Tensor
    gate_up_type: GGMLQuantType
    down: torch.Tensor
    down_type: GGMLQuantType

    def __post_init__(self) -> None:
        for field in ("gate_up_type", "down_type"):
            object.__setattr__(self, field, resolve_quant_type(getattr(self, field), field))
        for name in ("gate_up", "down"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 3:
                desc = (
                    f"{t.dtype} {tuple(t.shape)}"
                    if isinstance(t, torch.Tensor)
                    else type(t).__name__
                )
                raise ShapeMismatchError(
                    f"{name} must be a 3-D uint8 tensor of GGUF blocks, got {desc}"
                )
        gu_fmt, down_fmt = block_format(self.gate_up_type), block_format(self.down_type)
        e, two_i, gu_bytes = self.gate_up.shape
        if two_i % 2 or two_i == 0:
            raise ShapeMismatchError(f"gate_up rows (2*I) must be even and positive, got {two_i}")
        if gu_bytes % gu_fmt.block_bytes:
            raise ShapeMismatchError(
                f"gate_up has {gu_bytes} bytes per row, not whole {self.gate_up_type.name} blocks "
                f"of {gu_fmt.block_bytes} B"
            )
        hidden = gu_bytes // gu_fmt.block_bytes * gu_fmt.block_size
        inter = two_i // 2
        expected = (e, hidden, down_fmt.row_bytes(inter))
        if inter % down_fmt.block_size or tuple(self.down.shape) != expected:
            raise ShapeMismatchError(
                f"down must be (E={e}, H={hidden}, row_bytes({self.down_type.name}, I={inter})) = "
                f"{expected} to match gate_up {tuple(self.gate_up.shape)}, "
                f"got {tuple(self.down.shape)}"
            )
        if self.gate_up.device != self.down.device:
            raise ShapeMismatchError(
                f"gate_up ({self.gate_up.device}) and down ({self.down.device}) must share a device"
            )

    @property
    def num_experts(self) -> int:
        return int(self.gate_up.shape[0])

    @property
    def hidden_size(self) -> int:
        """H: gate_up's input width, down's output rows."""
        return int(self.down.shape[1])

    @property
    def intermediate_size(self) -> int:
        """I: per-expert intermediate width (gate_up has 2*I rows)."""
        return int(self.gate_up.shape[1]) // 2

    @property
    def device(self) -> torch.device:
        return self.gate_up.device

    def to(self, device: torch.device | str) -> GGMLExpertBank:
        """A copy of the bank on ``device``."""
        return GGMLExpertBank(
            self.gate_up.to(device), self.gate_up_type, self.down.to(device), self.down_type
        )


class GGMLMoEMethod:
    """Routed experts from GGUF-quantized weights with the GGML MoE kernels.

    ``apply`` = gate_up (kernel) -> SiLU-and-mul -> down (kernel, ``top_k=1``
    over ``tokens*top_k`` rows) -> times ``topk_weights`` -> sum over top_k.
    It never applies ``routed_scaling_factor``: the combine folds it into the
    shared-expert add, hence ``fuses_routed_scale_and_shared_add = True``.

    Up to ``batched_threshold`` tokens both matmuls use ``ggml_moe_a8_vec``
    (one program per token-expert pair); above it, ``ggml_moe_a8`` on pairs
    aligned by expert, which reads each weight block once per ``BLOCK_M``
    pairs of an expert. ``tile`` overrides the batched kernel's
    ``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)``. Both paths compute the same
    Q8_1 numerics.
    """

    fuses_routed_scale_and_shared_add: ClassVar[bool] = True

    def __init__(
        self, batched_threshold: int = 64, tile: tuple[int, int, int, int] | None = None
    ) -> None:
        if isinstance(batched_threshold, bool) or not isinstance(batched_threshold, int):
            raise ArgumentTypeError(
                f"batched_threshold must be an int, got {type(batched_threshold).__name__}"
            )
        if batched_threshold < 0:
            raise ShapeMismatchError(f"batched_threshold must be >= 0, got {batched_threshold}")
        if tile is not None:
            _check_tile(tile)  # else a bad tile surfaced only above the threshold
        self.batched_threshold = batched_threshold
        self.tile = tile

    def apply(
        self,
        layer: GGMLExpertBank,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Routed output ``(tokens, H)`` in ``x.dtype`` for ``x (tokens, H)``.

        ``topk_ids (tokens, top_k)`` int32 or int64 (converted to int32),
        ``topk_weights`` of the same shape, any float dtype.
        """
        if not isinstance(layer, GGMLExpertBank):
            raise ArgumentTypeError(f"layer must be a GGMLExpertBank, got {type(layer).__name__}")
        check_routing(x, topk_weights, topk_ids, layer.num_experts, layer.hidden_size)
        tokens, top_k = topk_ids.shape
        hidden = layer.hidden_size
        if tokens == 0:
            return x.new_zeros((0, hidden))
        ids = topk_ids.to(torch.int32)
        down = _routed_rows(layer, x, ids, self.tile, tokens > self.batched_threshold)
        routed = down.view(tokens, top_k, hidden) * topk_weights.to(torch.float32).unsqueeze(-1)
        return routed.sum(dim=1).to(x.dtype)


def _routed_rows(
    layer: GGMLExpertBank,
    x: torch.Tensor,
    ids: torch.Tensor,
    tile: tuple[int, int, int, int] | None,
    batched: bool,
) -> torch.Tensor:
    """``(tokens * top_k, H)`` down outputs, per pair or (``batched``) expert-grouped.

    Down's rows are the pairs themselves (``top_k = 1``), so the same flat ids,
    and one alignment when both tiles share BLOCK_M, index both matmuls. The
    ids were range-checked by check_routing in apply().
    """
    tokens, top_k = ids.shape
    inter, flat, out, block_m = layer.intermediate_size, ids.reshape(-1), x, 0
    steps = (
        (layer.gate_up, layer.gate_up_type, 2 * inter, top_k, tokens),
        (layer.down, layer.down_type, layer.hidden_size, 1, tokens * top_k),
    )
    for w, qtype, row, k, n in steps:
        if out is not x:  # in float32: the down kernel re-quantizes it to Q8_1 anyway
            out = F.silu(out[:, :inter].float()) * out[:, inter:].float()
        if not batched:
            out = ggml_moe_a8_vec(out, w, flat, k, qtype, row, n, check_ids=False)
            continue
        m = ggml_moe_get_block_size(qtype, tile)
        if m != block_m:  # the two types' default tiles pad pairs differently
            aligned, block_m = moe_align_block_size(ids, m, layer.num_experts), m
        out = ggml_moe_a8(out, w, *aligned, qtype, row, k, n, tile=tile, check_ids=False)
    return out


if TYPE_CHECKING:
    from sgl_core import MoEMethod

    _m: MoEMethod = GGMLMoEMethod()
