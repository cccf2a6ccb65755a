"""Ascend MoE methods (torch path on CPU) against sgl_core's TorchMoEMethod reference."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from sgl_ascend import (
    AscendMoEMethod,
    AscendW8A8DynamicMoEMethod,
    W8A8MoEWeights,
    quantize_per_token,
)
from sgl_core import MoEWeights, TorchMoEMethod, maybe_fuse_routed_scale_and_shared_add
from sgl_core.errors import IndexOutOfRangeError, IndexShapeError, ShapeMismatchError

E, H, INTER, TOKENS, TOP_K = 6, 32, 16, 10, 3


def problem(
    dtype: torch.dtype, seed: int = 0
) -> tuple[MoEWeights, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * INTER, H, generator=gen) / H**0.5).to(dtype)
    w2 = (torch.randn(E, H, INTER, generator=gen) / INTER**0.5).to(dtype)
    x = torch.randn(TOKENS, H, generator=gen).to(dtype)
    logits = torch.randn(TOKENS, E, generator=gen)
    weights, ids = torch.softmax(logits, -1).topk(TOP_K, dim=-1)
    ids[0] = torch.tensor([0, 1, 2])  # expert 5 may get nothing; expert 0 surely gets a token
    return MoEWeights(w13, w2), x, weights, ids


@pytest.mark.parametrize(
    ("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-3)]
)
def test_unquantized_matches_reference(dtype: torch.dtype, atol: float) -> None:
    layer, x, w, ids = problem(dtype)
    got = AscendMoEMethod().apply(layer, x, w, ids)
    ref = TorchMoEMethod().apply(layer, x, w, ids)
    assert got.dtype == dtype
    assert got.shape == (TOKENS, H)
    # Same float32 math grouped the same way: equal up to one rounding of the output.
    torch.testing.assert_close(got.float(), ref.float(), atol=atol, rtol=atol)


def test_unused_experts_and_top1() -> None:
    layer, x, w, _ = problem(torch.float32, seed=1)
    ids = torch.full((TOKENS, 1), 3, dtype=torch.int64)
    ones = torch.ones(TOKENS, 1)
    got = AscendMoEMethod().apply(layer, x, ones, ids)
    torch.testing.assert_close(got, TorchMoEMethod().apply(layer, x, ones, ids))
    del w


def test_w8a8_quantization_round_trip() -> None:
    layer, _, _, _ = problem(torch.float32)
    q = W8A8MoEWeights.quantize(layer)
    assert q.w13_weight.dtype == torch.int8
    assert q.w13_weight_scale.shape == (E, 2 * INTER)
    deq = q.dequantize()
    # Symmetric per-channel int8: error at most half a step (amax / 127 / 2) per element.
    step = layer.w13_weight.abs().amax(-1, keepdim=True) / 127
    assert bool(((deq.w13_weight - layer.w13_weight).abs() <= step / 2 + 1e-7).all())
    xq, xs = quantize_per_token(torch.randn(4, H))
    assert xq.dtype == torch.int8
    assert xs.shape == (4,)
    with pytest.raises(ShapeMismatchError):
        W8A8MoEWeights(q.w13_weight, q.w13_weight_scale[:, :-1], q.w2_weight, q.w2_weight_scale)
    with pytest.raises(ShapeMismatchError):
        W8A8MoEWeights(q.w13_weight.float(), q.w13_weight_scale, q.w2_weight, q.w2_weight_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_dynamic_close_to_dequantized_reference(dtype: torch.dtype) -> None:
    """Against TorchMoEMethod on the *dequantized* weights with float activations.

    Weights are then identical, so the only difference is the per-token int8
    quantization of the two activations (x, and the SiLU-and-mul output):
    each element is off by at most half a step, ``amax/254``, i.e. ~0.4 % of a
    row's largest value. Those errors are independent and partly cancel in the
    dot products, so a 3 % relative L2 error bound is loose yet still catches
    any scale, rounding or grouping mistake (those give errors of order 100 %).
    """
    layer, x, w, ids = problem(torch.float32, seed=2)
    q = W8A8MoEWeights.quantize(layer)
    x = x.to(dtype)
    got = AscendW8A8DynamicMoEMethod().apply(q, x, w, ids)
    ref = TorchMoEMethod().apply(q.dequantize(), x.float(), w, ids)
    assert got.dtype == dtype
    rel = (got.float() - ref).norm() / ref.norm()
    assert float(rel) < 0.03


def test_routing_is_validated() -> None:
    layer, x, w, ids = problem(torch.float32)
    with pytest.raises(IndexOutOfRangeError):
        AscendMoEMethod().apply(layer, x, w, ids + E)
    with pytest.raises(IndexShapeError):
        AscendMoEMethod().apply(layer, x[:-1], w, ids)


class ScalingAscendMoEMethod(AscendMoEMethod):
    """Counterfactual: the same method but applying routed_scaling_factor itself."""

    fuses_routed_scale_and_shared_add: ClassVar[bool] = False

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def apply(self, layer: Any, x: Any, topk_weights: Any, topk_ids: Any) -> torch.Tensor:
        return super().apply(layer, x, topk_weights, topk_ids) * self.scale


class Experts:
    def __init__(self, method: object, in_topk: bool = False) -> None:
        self.quant_method = method
        self.should_fuse_routed_scaling_factor_in_topk = in_topk


@pytest.mark.parametrize("with_shared", [True, False])
def test_combine_gives_same_result_either_way(with_shared: bool) -> None:
    """fuses_routed_scale_and_shared_add=True (ours) and False end in the same sum."""
    assert AscendMoEMethod.fuses_routed_scale_and_shared_add is True
    assert AscendW8A8DynamicMoEMethod.fuses_routed_scale_and_shared_add is True
    scale = 2.5
    layer, x, w, ids = problem(torch.float32, seed=3)
    shared = torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(9))
    ref_routed = TorchMoEMethod().apply(layer, x, w, ids)
    expected = ref_routed * scale + (shared if with_shared else 0)

    def combine(experts: Experts, topk_w: torch.Tensor) -> torch.Tensor:
        routed = experts.quant_method.apply(layer, x, topk_w, ids)  # type: ignore[attr-defined]
        extra = shared.clone() if with_shared else None
        return maybe_fuse_routed_scale_and_shared_add(experts, routed, extra, scale)

    folded = combine(Experts(AscendMoEMethod()), w)
    scaled = combine(Experts(ScalingAscendMoEMethod(scale)), w)
    in_topk = combine(Experts(AscendMoEMethod(), in_topk=True), w * scale)
    for got in (folded, scaled, in_topk):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
