"""The GGML method's ``sgl-bench moe`` case: registered, and consistent with its reference."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core.errors import BackendUnavailableError
from sgl_cuda.quantization._bench_case import ggml_q8_0_case

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_registered_under_the_bench_group() -> None:
    names = {ep.name: ep.value for ep in entry_points(group=sgl_core.backend.MOE_BENCH_GROUP)}
    assert names.get("ggml_q8_0") == "sgl_cuda.quantization._bench_case:ggml_q8_0_case"


def test_case_matches_its_dense_reference() -> None:
    case = ggml_q8_0_case(DEVICE, True)
    experts, _, hidden = case.reference.w13_weight.shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, hidden, generator=gen).to(DEVICE)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(3)]).to(DEVICE)
    weights = torch.rand(3, 2, generator=gen).to(DEVICE)
    got = case.method.apply(case.layer, x, weights, ids.int())
    want = sgl_core.TorchMoEMethod().apply(case.reference, x, weights, ids)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < case.tolerance


def test_cpu_case_never_flips_a_cuda_process_to_the_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET=1 from process start"):
        ggml_q8_0_case(torch.device("cpu"), True)
    assert "TRITON_INTERPRET" not in os.environ
