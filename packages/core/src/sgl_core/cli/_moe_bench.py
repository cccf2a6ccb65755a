"""``sgl-bench moe``: the routed/shared combine and the MoE methods, timed and checked."""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any

import torch
import torch.nn.functional as F

from sgl_core.cli._report import median, time_interleaved
from sgl_core.moe._bench_case import MoEBenchCase
from sgl_core.moe._moe import MoEWeights, TorchMoEMethod, maybe_fuse_routed_scale_and_shared_add

__all__ = ["MoERecord", "bench_combine", "check_case", "check_torch_moe"]

SCALE = 2.5  # DeepSeek-V3's routed_scaling_factor
# methods that leave the routed scale to the combine (fused) or scaled it themselves
_FOLDS = types.SimpleNamespace(fuses_routed_scale_and_shared_add=True)
_SCALED = types.SimpleNamespace(fuses_routed_scale_and_shared_add=False)


@dataclasses.dataclass
class MoERecord:
    """One timed or checked MoE operation."""

    impl: str
    op: str
    shape: str
    dtype: str
    device: str
    seconds: float
    bytes: int
    gbps: float
    samples: int
    verified: bool | None
    max_err: float | None = None
    speedup: float | None = None
    note: str = ""
    #: Ran in Triton's interpreter (``TRITON_INTERPRET=1``): checked, but its timing is moot.
    interpreted: bool = False


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref| (``ref`` in float64)."""
    return float((got.double() - ref).abs().max() / ref.abs().max())


def _records(
    samples: dict[str, list[float]],
    errs: dict[str, tuple[float, float]],
    nbytes: int,
    device: torch.device,
    **fields: Any,
) -> list[MoERecord]:
    """One record per timed impl; ``errs[impl]`` = (max error, tolerance); ``fields``: the rest.

    With two impls the first one's speedup is over the second.
    """
    records: list[MoERecord] = []
    for impl, times in samples.items():
        err, tol = errs[impl]
        seconds = median(times)
        records.append(
            MoERecord(
                impl=impl,
                device=str(device),
                seconds=seconds,
                bytes=nbytes,
                gbps=nbytes / seconds / 1e9,
                samples=len(times),
                verified=err <= tol,
                max_err=err,
                **fields,
            )
        )
    if len(records) == 2:
        records[0].speedup = records[1].seconds / records[0].seconds
    return records


def bench_combine(
    tokens: int, hidden: int, dtype: torch.dtype, device: torch.device, repeats: int
) -> list[MoERecord]:
    """Fused ``shared.add_(routed, alpha=s)`` vs unfused ``routed.mul_(s); routed.add_(shared)``."""
    gen = torch.Generator(device=device).manual_seed(0)
    routed0 = torch.randn(tokens, hidden, generator=gen, device=device).to(dtype)
    shared0 = torch.randn(tokens, hidden, generator=gen, device=device).to(dtype)
    routed, shared = routed0.clone(), shared0.clone()
    out: dict[str, torch.Tensor] = {}

    def reset() -> None:
        routed.copy_(routed0)
        shared.copy_(shared0)

    def fused() -> None:
        out["fused"] = maybe_fuse_routed_scale_and_shared_add(_FOLDS, routed, shared, SCALE)

    def unfused() -> None:
        routed.mul_(SCALE)  # what a method that does not fold the scale does itself
        out["unfused"] = maybe_fuse_routed_scale_and_shared_add(_SCALED, routed, shared, SCALE)

    ops = {"fused": fused, "unfused": unfused}
    samples = time_interleaved(
        ops,
        warmup=1,
        repeats=repeats,
        budget_s=30.0,
        device=device,
        prepare=dict.fromkeys(ops, reset),
    )
    ref = shared0.double() + SCALE * routed0.double()
    errs: dict[str, tuple[float, float]] = {}
    for impl, tol in (("fused", 2.0**-8), ("unfused", 2.0**-7)):
        reset()
        ops[impl]()
        errs[impl] = (_rel_err(out[impl], ref), tol)
    return _records(
        samples,
        errs,
        tokens * hidden * routed.element_size(),
        device,
        op="combine",
        shape=f"T={tokens},H={hidden}",
        dtype=str(dtype).removeprefix("torch."),
    )


def _dense_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Every expert on every token in float64, mixed by a dense routing matrix."""
    num_experts = w13.shape[0]
    mix = torch.zeros(x.shape[0], num_experts, dtype=torch.float64, device=x.device)
    mix.scatter_add_(1, topk_ids.long(), topk_weights.double())
    xd = x.double()
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    inter = w13.shape[1] // 2
    for e in range(num_experts):
        h = xd @ w13[e].double().t()
        act = F.silu(h[:, :inter]) * h[:, inter:]
        out += mix[:, e : e + 1] * (act @ w2[e].double().t())
    return out


def _routing(
    tokens: int, num_experts: int, top_k: int, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(tokens, num_experts, generator=gen, device=device)
    weights, ids = torch.topk(torch.sigmoid(logits), top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


def check_torch_moe(
    tokens: int, hidden: int, inter: int, experts: int, top_k: int, device: torch.device
) -> list[MoERecord]:
    """``TorchMoEMethod`` + combine vs a dense float64 computation (bf16 inputs)."""
    gen = torch.Generator(device=device).manual_seed(1)
    dtype = torch.bfloat16
    x = torch.randn(tokens, hidden, generator=gen, device=device).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen, device=device) / hidden**0.5).to(
        dtype
    )
    w2 = (torch.randn(experts, hidden, inter, generator=gen, device=device) / inter**0.5).to(dtype)
    shared = torch.randn(tokens, hidden, generator=gen, device=device).to(dtype)
    topk_weights, topk_ids = _routing(tokens, experts, top_k, gen, device)
    method = TorchMoEMethod()
    layer = MoEWeights(w13, w2)
    result: dict[str, torch.Tensor] = {}

    def apply() -> None:
        result["routed"] = method.apply(layer, x, topk_weights, topk_ids)

    samples = time_interleaved(
        {"torch_moe": apply}, warmup=1, repeats=3, budget_s=10.0, device=device
    )
    combined = maybe_fuse_routed_scale_and_shared_add(
        method, result["routed"], shared.clone(), SCALE
    )
    ref = _dense_moe(x, w13, w2, topk_weights, topk_ids)
    err = _rel_err(result["routed"], ref)
    err_c = _rel_err(combined, shared.double() + SCALE * ref)
    return _records(
        samples,
        {"torch_moe": (max(err, err_c), 2e-2)},
        (w13.numel() + w2.numel()) * w13.element_size(),
        device,
        op="moe_apply+combine",
        shape=f"T={tokens},H={hidden},I={inter},E={experts},top_k={top_k}",
        dtype=str(dtype).removeprefix("torch."),
        note="vs dense float64 reference (every expert on every token, routing matrix)",
    )


def check_case(case: MoEBenchCase, device: torch.device, repeats: int) -> list[MoERecord]:
    """A device package's method vs the torch reference on the same dense weights.

    Both are checked against a float64 dense computation of ``case.reference``.
    """
    ref_w = case.reference
    experts, _, hidden = ref_w.w13_weight.shape
    tokens, top_k = (64, 4) if device.type == "cuda" else (4, 2)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, hidden, generator=gen).to(device, torch.bfloat16)
    topk_weights, topk_ids = _routing(tokens, experts, top_k, gen, torch.device("cpu"))
    topk_weights, topk_ids = topk_weights.to(device), topk_ids.to(device)
    dense_bf16 = MoEWeights(ref_w.w13_weight.to(torch.bfloat16), ref_w.w2_weight.to(torch.bfloat16))
    result: dict[str, torch.Tensor] = {}

    def method() -> None:
        result[case.name] = case.method.apply(case.layer, x, topk_weights, topk_ids)

    def reference() -> None:
        result["torch_dense"] = TorchMoEMethod().apply(dense_bf16, x, topk_weights, topk_ids)

    ops = {case.name: method, "torch_dense": reference}
    samples = time_interleaved(
        ops, warmup=1, repeats=repeats if device.type == "cuda" else 1, budget_s=30.0, device=device
    )
    ref = _dense_moe(x, ref_w.w13_weight, ref_w.w2_weight, topk_weights, topk_ids)
    tols = {case.name: case.tolerance, "torch_dense": 3e-2}
    records = _records(
        samples,
        {impl: (_rel_err(result[impl], ref), tol) for impl, tol in tols.items()},
        sum(
            t.numel() * t.element_size()
            for t in vars(case.layer).values()
            if isinstance(t, torch.Tensor)
        ),
        device,
        op=f"moe_method:{case.name}",
        shape=f"T={tokens},H={hidden},I={ref_w.w2_weight.shape[2]},E={experts},top_k={top_k}",
        dtype="bfloat16",
        note=case.note,
    )
    records[0].interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return records
