"""Boundary tests of the MoE routing check and the routed/shared combine (issue #18)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from sgl_core import errors
from sgl_core.moe._moe import (
    MoEWeights,
    check_routing,
    folds_routed_scale,
    maybe_fuse_routed_scale_and_shared_add,
)

E, H, T, K = 4, 8, 3, 2


def routing() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.arange(T * H, dtype=torch.float32).view(T, H)
    ids = torch.tensor([[0, E - 1], [1, 2], [E - 1, 0]])
    return x, torch.full((T, K), 0.5), ids


def test_check_routing_accepts_the_edges_and_returns_tokens() -> None:
    x, w, ids = routing()
    assert check_routing(x, w, ids, E, H) == T
    assert check_routing(x, w, ids.int(), E, H) == T  # int32 ids
    assert check_routing(x.half(), w.bfloat16(), ids, E, H) == T
    assert check_routing(x[:0], w[:0], ids[:0], E, H) == 0
    assert check_routing(x[:1], w[:1, :1], ids[:1, :1], E, H) == 1  # top_k 1


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("x list", errors.ArgumentTypeError),
        ("weights list", errors.ArgumentTypeError),
        ("ids list", errors.ArgumentTypeError),
        ("int x", errors.ArgumentTypeError),
        ("int weights", errors.ArgumentTypeError),
        ("x 3-D", errors.ShapeMismatchError),
        ("x 1-D", errors.ShapeMismatchError),
        ("hidden", errors.ShapeMismatchError),
        ("int16 ids", errors.IndexDTypeError),
        ("bool ids", errors.IndexDTypeError),
        ("ids 1-D", errors.IndexShapeError),
        ("ids 3-D", errors.IndexShapeError),
        ("ids tokens", errors.IndexShapeError),
        ("top_k 0", errors.IndexShapeError),
        ("weights top_k", errors.IndexShapeError),
        ("weights tokens", errors.IndexShapeError),
        ("ids device", errors.ShapeMismatchError),
        ("weights device", errors.ShapeMismatchError),
        ("all meta", errors.DeviceError),
        ("id == experts", errors.IndexOutOfRangeError),
        ("id -1", errors.IndexOutOfRangeError),
    ],
)
def test_check_routing_rejects(case: str, error: type[Exception]) -> None:
    x, w, ids = routing()
    args: tuple[object, ...] = {
        "x list": (x.tolist(), w, ids),
        "weights list": (x, w.tolist(), ids),
        "ids list": (x, w, ids.tolist()),
        "int x": (x.long(), w, ids),
        "int weights": (x, w.long(), ids),
        "x 3-D": (x.view(T, 1, H), w, ids),
        "x 1-D": (x.flatten(), w, ids),
        "hidden": (x[:, 1:], w, ids),
        "int16 ids": (x, w, ids.short()),
        "bool ids": (x, w, ids.bool()),
        "ids 1-D": (x, w, ids.flatten()),
        "ids 3-D": (x, w, ids.view(T, K, 1)),
        "ids tokens": (x, w[:2], ids[:2]),
        "top_k 0": (x, w[:, :0], ids[:, :0]),
        "weights top_k": (x, w[:, :1], ids),
        "weights tokens": (x, w[:2], ids),
        "ids device": (x, w, ids.to("meta")),
        "weights device": (x, w.to("meta"), ids),
        "all meta": (x.to("meta"), w.to("meta"), ids.to("meta")),
        "id == experts": (x, w, torch.where(ids == E - 1, E, ids)),
        "id -1": (x, w, torch.where(ids == 1, -1, ids)),
    }[case]
    with pytest.raises(error):
        check_routing(*args, E, H)  # type: ignore[arg-type]


def test_check_routing_names_the_bad_id() -> None:
    x, w, ids = routing()
    with pytest.raises(errors.IndexOutOfRangeError, match=rf"holds {E}, outside \[0, {E}\)"):
        check_routing(x, w, torch.where(ids == 0, E, ids), E, H)
    with pytest.raises(errors.IndexOutOfRangeError, match=r"holds -3, outside"):
        check_routing(x, w, torch.where(ids == 0, -3, E + 5), E, H)


def test_moe_weights_shapes() -> None:
    w13, w2 = torch.zeros(E, 2 * 6, H), torch.zeros(E, H, 6)
    weights = MoEWeights(w13, w2)
    assert weights.num_experts == E and weights.hidden_size == H
    for bad13, bad2 in (
        (torch.zeros(E, 11, H), torch.zeros(E, H, 5)),  # odd 2I
        (w13, torch.zeros(E, H, 5)),
        (w13, torch.zeros(E + 1, H, 6)),
        (w13, torch.zeros(E, H + 1, 6)),
    ):
        with pytest.raises(errors.ShapeMismatchError):
            MoEWeights(bad13, bad2)


class Method:
    def __init__(self, folds: object) -> None:
        self.fuses_routed_scale_and_shared_add = folds


class Experts:
    def __init__(self, method: object, in_topk: object = False) -> None:
        self.quant_method = method
        self.should_fuse_routed_scaling_factor_in_topk = in_topk


class Bare:
    """A method that declares nothing: it does not fold the scale."""


def combine(experts: object, shared: bool, scale: object = 3.0) -> torch.Tensor:
    routed = torch.full((2, 4), 2.0)
    other = torch.full((2, 4), 5.0) if shared else None
    return maybe_fuse_routed_scale_and_shared_add(experts, routed, other, scale)  # type: ignore[arg-type]


def test_combine_results_for_every_capability() -> None:
    def value(out: torch.Tensor) -> float:
        assert out.shape == (2, 4) and bool((out == out[0, 0]).all())
        return float(out[0, 0])

    assert value(combine(Experts(Method(True)), shared=True)) == 5.0 + 3.0 * 2.0
    assert value(combine(Experts(Method(True)), shared=False)) == 3.0 * 2.0
    assert value(combine(Experts(Method(True), in_topk=True), shared=True)) == 5.0 + 2.0
    assert value(combine(Experts(Method(True), in_topk=True), shared=False)) == 2.0
    assert value(combine(Experts(Method(False)), shared=True)) == 2.0 + 5.0
    assert value(combine(Experts(Method(False)), shared=False)) == 2.0
    assert value(combine(Experts(Bare()), shared=True)) == 2.0 + 5.0
    assert value(combine(Method(True), shared=False)) == 3.0 * 2.0  # a bare method
    assert value(combine(Experts(Method(np.True_)), shared=False, scale=2)) == 4.0
    assert value(combine(Experts(Method(np.array(True))), shared=False, scale=0.5)) == 1.0
    assert value(combine(Experts(Method(True)), shared=False, scale=Fraction(5, 2))) == 5.0
    assert value(combine(Experts(Method(True)), shared=False, scale=np.float32(1.5))) == 3.0
    assert value(combine(Experts(Method(np.False_)), shared=False)) == 2.0


def test_folds_routed_scale_reads_the_method() -> None:
    assert folds_routed_scale(Experts(Method(True)))
    assert not folds_routed_scale(Experts(Method(False)))
    assert folds_routed_scale(Method(True))
    assert not folds_routed_scale(Bare())
    assert not folds_routed_scale(Experts(Bare()))
    assert folds_routed_scale(Experts(Method(np.array(True))))
    for bad in (1, 0, "yes", None, np.array([True]), np.int64(1), torch.tensor(True)):
        with pytest.raises(errors.ArgumentTypeError, match="fuses_routed_scale_and_shared_add"):
            folds_routed_scale(Experts(Method(bad)))


@pytest.mark.parametrize(
    "case",
    [
        "routed list",
        "int routed",
        "shared list",
        "shared dtype",
        "shared shape",
        "shared device",
        "scale inf",
        "scale -inf",
        "scale nan",
        "scale bool",
        "scale str",
        "in_topk int",
        "capability int",
    ],
)
def test_combine_rejects_and_writes_nothing(case: str) -> None:
    routed, shared = torch.full((2, 4), 2.0), torch.full((2, 4), 5.0)
    r: object = routed
    s: object = shared
    scale: object = 3.0
    experts: object = Experts(Method(True))
    if case == "routed list":
        r = routed.tolist()
    elif case == "int routed":
        r, s = routed.long(), shared.long()
    elif case == "shared list":
        s = shared.tolist()
    elif case == "shared dtype":
        s = shared.double()
    elif case == "shared shape":
        s = shared.view(4, 2)
    elif case == "shared device":
        s = shared.to("meta")
    elif case.startswith("scale"):
        scale = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "bool": True}.get(
            case.split()[1], "3"
        )
    elif case == "in_topk int":
        experts = Experts(Method(True), in_topk=1)
    else:
        experts = Experts(Method(2))
    mismatch = case in ("shared dtype", "shared shape", "shared device")
    error = errors.ShapeMismatchError if mismatch else errors.ArgumentTypeError
    with pytest.raises(error):
        maybe_fuse_routed_scale_and_shared_add(experts, r, s, scale)  # type: ignore[arg-type]
    assert bool((routed == 2.0).all()) and bool((shared == 5.0).all())


def test_errors_name_the_argument_at_fault() -> None:
    x, w, ids = routing()
    for args, name in (
        ((x.tolist(), w, ids), "x"),
        ((x, w.tolist(), ids), "topk_weights"),
        ((x, w, ids.tolist()), "topk_ids"),
    ):
        with pytest.raises(errors.ArgumentTypeError, match=rf"^{name} must be a torch\.Tensor"):
            check_routing(*args, E, H)  # type: ignore[arg-type]
    # an id at each end out of range: the low one is named
    with pytest.raises(errors.IndexOutOfRangeError, match=rf"holds {E}, outside"):
        check_routing(x, w, torch.where(ids == 1, E, ids), E, H)  # 0 and E
    with pytest.raises(errors.ArgumentTypeError, match=r"^routed_scaling_factor must be a finite"):
        combine(Experts(Method(True)), shared=False, scale=math.inf)


class DTypeLike:
    """Has a bool-kind ``dtype`` but no ``shape``: not a bool either."""

    class dtype:  # mimics a numpy attribute
        kind = "b"


def test_capability_without_a_shape_is_a_typed_error() -> None:
    with pytest.raises(errors.ArgumentTypeError):
        folds_routed_scale(Method(DTypeLike()))
