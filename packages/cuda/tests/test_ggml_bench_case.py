"""The GGML method's ``sgl-bench moe`` case: registered, and consistent with its reference."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch

import sgl_core
from sgl_cuda.quantization._bench_case import ggml_q8_0_case


def test_registered_under_the_bench_group() -> None:
    names = {ep.name: ep.value for ep in entry_points(group=sgl_core.MOE_BENCH_GROUP)}
    assert names.get("ggml_q8_0") == "sgl_cuda.quantization._bench_case:ggml_q8_0_case"


def test_case_matches_its_dense_reference() -> None:
    case = ggml_q8_0_case(torch.device("cpu"), True)
    experts, _, hidden = case.reference.w13_weight.shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, hidden, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(3)])
    weights = torch.rand(3, 2, generator=gen)
    got = case.method.apply(case.layer, x, weights, ids.int())
    want = sgl_core.TorchMoEMethod().apply(case.reference, x, weights, ids)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < case.tolerance
