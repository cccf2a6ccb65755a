"""The Ascend W8A8 method's ``sgl-bench moe`` case: registered, consistent with its reference."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_ascend._bench_case import w8a8_dynamic_case
from sgl_core.errors import BackendUnavailableError


def test_registered_under_the_bench_group() -> None:
    names = {ep.name: ep.value for ep in entry_points(group=sgl_core.backend.MOE_BENCH_GROUP)}
    assert names.get("ascend_w8a8_dynamic") == "sgl_ascend._bench_case:w8a8_dynamic_case"


def test_case_matches_its_dense_reference() -> None:
    case = w8a8_dynamic_case(torch.device("cpu"), True)
    experts, _, hidden = case.reference.w13_weight.shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, hidden, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(5)])
    weights = torch.rand(5, 2, generator=gen)
    got = case.method.apply(case.layer, x, weights, ids)
    want = sgl_core.TorchMoEMethod().apply(case.reference, x, weights, ids)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < case.tolerance


def test_refuses_cuda_devices() -> None:
    with pytest.raises(BackendUnavailableError):
        w8a8_dynamic_case(torch.device("cuda"), True)
