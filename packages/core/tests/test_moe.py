"""The combine reads a capability attribute; the reference method matches a dense oracle."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest
import torch

import sgl_core
from sgl_core import errors


class _Folds:
    fuses_routed_scale_and_shared_add: ClassVar[bool] = True


class _Scales:
    fuses_routed_scale_and_shared_add: ClassVar[bool] = False


class _Experts:
    def __init__(self, method: object, in_topk: bool = False) -> None:
        self.quant_method = method
        self.should_fuse_routed_scaling_factor_in_topk = in_topk


def tensors() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(5, 8, generator=gen).bfloat16(),
        torch.randn(5, 8, generator=gen).bfloat16(),
    )


def test_folding_method_adds_scaled_routed_into_shared() -> None:
    routed, shared = tensors()
    expected = (shared.float() + 2.5 * routed.float()).bfloat16()
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(
        _Experts(_Folds()), routed, shared.clone(), 2.5
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)


def test_in_place_semantics() -> None:
    routed, shared = tensors()
    s = shared.clone()
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(_Experts(_Folds()), routed, s, 2.0)
    assert out.data_ptr() == s.data_ptr()
    r = routed.clone()
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(_Experts(_Folds()), r, None, 2.0)
    assert out.data_ptr() == r.data_ptr()
    assert torch.equal(out, (routed * 2.0))
    r = routed.clone()
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(_Experts(_Scales()), r, shared, 2.0)
    assert out.data_ptr() == r.data_ptr() and torch.equal(out, routed + shared)


def test_scale_already_in_topk_weights() -> None:
    routed, shared = tensors()
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(
        _Experts(_Folds(), in_topk=True), routed, shared.clone(), 2.5
    )
    assert torch.equal(out, shared + routed)


def test_method_without_attribute_counts_as_not_fused() -> None:
    routed, _ = tensors()
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(
        _Experts(object()), routed.clone(), None, 3.0
    )
    assert torch.equal(out, routed)
    assert not sgl_core.folds_routed_scale(object())
    assert sgl_core.folds_routed_scale(_Folds())


def test_shape_mismatch_is_an_error() -> None:
    routed, shared = tensors()
    with pytest.raises(errors.ShapeMismatchError):
        sgl_core.maybe_fuse_routed_scale_and_shared_add(_Experts(_Folds()), routed, shared[:2], 1.0)


def test_combine_imports_no_device_package() -> None:
    code = (
        "import sys, torch, sgl_core\n"
        "class M:\n    fuses_routed_scale_and_shared_add = True\n"
        "class E:\n    quant_method = M()\n"
        "sgl_core.maybe_fuse_routed_scale_and_shared_add(E(), torch.ones(2), torch.ones(2), 2.0)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('sgl_cuda', 'sgl_ascend', 'triton', 'torch_npu')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reference_method_matches_dense_oracle() -> None:
    gen = torch.Generator().manual_seed(1)
    e, h, i, t, k = 6, 32, 16, 9, 3
    weights = sgl_core.MoEWeights(
        torch.randn(e, 2 * i, h, generator=gen) / 4, torch.randn(e, h, i, generator=gen) / 4
    )
    x = torch.randn(t, h, generator=gen)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=gen)
    out = sgl_core.TorchMoEMethod().apply(weights, x, w, ids)
    expected = torch.zeros(t, h)
    for tok in range(t):
        for slot in range(k):
            ex = int(ids[tok, slot])
            gate_up = weights.w13_weight[ex] @ x[tok]
            act = torch.nn.functional.silu(gate_up[:i]) * gate_up[i:]
            expected[tok] += w[tok, slot] * (weights.w2_weight[ex] @ act)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(errors.IndexOutOfRangeError):
        sgl_core.TorchMoEMethod().apply(weights, x, w, ids + e)
