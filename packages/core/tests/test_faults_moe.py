"""MoE edge cases and abuse: the shared routing check and the combine's argument checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sgl_core
from sgl_core import errors

E, H, INTER, T, K = 4, 32, 16, 5, 2


def problem() -> tuple[sgl_core.MoEWeights, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    weights = sgl_core.MoEWeights(
        torch.randn(E, 2 * INTER, H, generator=gen), torch.randn(E, H, INTER, generator=gen)
    )
    x = torch.randn(T, H, generator=gen)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    return weights, x, torch.rand(T, K, generator=gen), ids


def test_empty_batch_returns_zero_rows() -> None:
    weights, x, w, ids = problem()
    out = sgl_core.TorchMoEMethod().apply(weights, x[:0], w[:0], ids[:0])
    assert out.shape == (0, H) and out.dtype == x.dtype


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("float ids", errors.IndexDTypeError),
        ("hidden mismatch", errors.ShapeMismatchError),
        ("id == experts", errors.IndexOutOfRangeError),
        ("negative id", errors.IndexOutOfRangeError),
        ("top_k 0", errors.IndexShapeError),
        ("weights shape", errors.IndexShapeError),
        ("int weights", errors.ArgumentTypeError),
        ("x not a tensor", errors.ArgumentTypeError),
        ("meta tensors", errors.DeviceError),
    ],
)
def test_bad_routing_is_a_typed_error(case: str, error: type[Exception]) -> None:
    weights, x, w, ids = problem()
    args = {
        "float ids": (x, w, ids.float()),
        "hidden mismatch": (x[:, :-8], w, ids),
        "id == experts": (x, w, torch.where(ids == 0, E, ids)),
        "negative id": (x, w, ids - E),
        "top_k 0": (x, w[:, :0], ids[:, :0]),
        "weights shape": (x, w[:, :1], ids),
        "int weights": (x, w.long(), ids),
        "x not a tensor": (x.tolist(), w, ids),
        "meta tensors": (x.to("meta"), w.to("meta"), ids.to("meta")),
    }[case]
    with pytest.raises(error):
        sgl_core.TorchMoEMethod().apply(weights, *args)  # type: ignore[arg-type]


class Folds:
    fuses_routed_scale_and_shared_add = True


class NumpyFolds:
    fuses_routed_scale_and_shared_add = np.True_


class NumpyDoesNotFold:
    fuses_routed_scale_and_shared_add = np.False_


class IntFolds:
    fuses_routed_scale_and_shared_add = 1


class Experts:
    def __init__(self, method: object, in_topk: object = False) -> None:
        self.quant_method = method
        self.should_fuse_routed_scaling_factor_in_topk = in_topk


def test_numpy_bool_capability_is_honoured() -> None:
    routed, shared = torch.ones(3, 4), torch.full((3, 4), 2.0)
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(
        Experts(NumpyFolds()), routed.clone(), shared.clone(), 2.5
    )
    assert torch.equal(out, shared + 2.5 * routed)
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(
        Experts(NumpyDoesNotFold()), routed.clone(), shared.clone(), 2.5
    )
    assert torch.equal(out, routed + shared)
    out = sgl_core.maybe_fuse_routed_scale_and_shared_add(
        Experts(Folds(), in_topk=np.True_), routed.clone(), None, 2.5
    )
    assert torch.equal(out, routed)
    assert sgl_core.folds_routed_scale(NumpyFolds())


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("routed None", errors.ArgumentTypeError),
        ("shared list", errors.ArgumentTypeError),
        ("dtype mismatch", errors.ShapeMismatchError),
        ("shape mismatch", errors.ShapeMismatchError),
        ("int capability", errors.ArgumentTypeError),
        ("str in_topk", errors.ArgumentTypeError),
        ("scale None", errors.ArgumentTypeError),
        ("scale nan", errors.ArgumentTypeError),
        ("int routed", errors.ArgumentTypeError),
    ],
)
def test_bad_combine_arguments_change_nothing(case: str, error: type[Exception]) -> None:
    routed, shared = torch.ones(3, 4), torch.full((3, 4), 2.0)
    experts: object = Experts(Folds())
    r: object = routed
    s: object = shared
    scale: object = 2.0
    if case == "routed None":
        r = None
    elif case == "shared list":
        s = shared.tolist()
    elif case == "dtype mismatch":
        s = shared.bfloat16()
    elif case == "shape mismatch":
        s = shared[:2]
    elif case == "int capability":
        experts = Experts(IntFolds())
    elif case == "str in_topk":
        experts = Experts(Folds(), in_topk="yes")
    elif case == "scale None":
        scale = None
    elif case == "int routed":  # a float scale cannot be applied in place
        r, s = routed.int(), None
    else:
        scale = math.nan
    with pytest.raises(error):
        sgl_core.maybe_fuse_routed_scale_and_shared_add(experts, r, s, scale)  # type: ignore[arg-type]
    assert torch.equal(routed, torch.ones(3, 4)) and torch.equal(shared, torch.full((3, 4), 2.0))


def test_shared_none_is_documented_behaviour() -> None:
    routed = torch.ones(2, 2)
    assert torch.equal(
        sgl_core.maybe_fuse_routed_scale_and_shared_add(Experts(Folds()), routed, None, 3.0),
        torch.full((2, 2), 3.0),
    )
