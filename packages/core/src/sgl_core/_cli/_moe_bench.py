"""``sgl-bench moe``: the routed/shared combine and the MoE methods, timed and checked."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from sgl_core._cli._timing import median, time_interleaved
from sgl_core._moe import MoEWeights, TorchMoEMethod, maybe_fuse_routed_scale_and_shared_add

__all__ = ["MoERecord", "bench_combine", "check_ggml", "check_torch_moe"]

SCALE = 2.5  # DeepSeek-V3's routed_scaling_factor


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

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Folds:
    """A method that leaves the routed scale to the combine (fused path)."""

    fuses_routed_scale_and_shared_add: ClassVar[bool] = True


class _Scales:
    """A method that already scaled ``routed`` itself (unfused path)."""

    fuses_routed_scale_and_shared_add: ClassVar[bool] = False


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
        out["fused"] = maybe_fuse_routed_scale_and_shared_add(_Folds(), routed, shared, SCALE)

    def unfused() -> None:
        routed.mul_(SCALE)  # what a method that does not fold the scale does itself
        out["unfused"] = maybe_fuse_routed_scale_and_shared_add(_Scales(), routed, shared, SCALE)

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
    scale = float(ref.abs().max())
    records: list[MoERecord] = []
    for impl, tol in (("fused", 2.0**-8), ("unfused", 2.0**-7)):
        reset()
        ops[impl]()
        err = float((out[impl].double() - ref).abs().max()) / scale
        seconds = median(samples[impl])
        nbytes = tokens * hidden * routed.element_size()
        records.append(
            MoERecord(
                impl=impl,
                op="combine",
                shape=f"T={tokens},H={hidden}",
                dtype=_dtype_name(dtype),
                device=str(device),
                seconds=seconds,
                bytes=nbytes,
                gbps=nbytes / seconds / 1e9,
                samples=len(samples[impl]),
                verified=err <= tol,
                max_err=err,
            )
        )
    records[0].speedup = records[1].seconds / records[0].seconds
    return records


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

    samples = time_interleaved({"apply": apply}, warmup=1, repeats=3, budget_s=10.0, device=device)
    combined = maybe_fuse_routed_scale_and_shared_add(
        method, result["routed"], shared.clone(), SCALE
    )
    ref = _dense_moe(x, w13, w2, topk_weights, topk_ids)
    ref_combined = shared.double() + SCALE * ref
    err = float((result["routed"].double() - ref).abs().max() / ref.abs().max())
    err_c = float((combined.double() - ref_combined).abs().max() / ref_combined.abs().max())
    shape = f"T={tokens},H={hidden},I={inter},E={experts},top_k={top_k}"
    seconds = median(samples["apply"])
    nbytes = (w13.numel() + w2.numel()) * w13.element_size()
    return [
        MoERecord(
            impl="torch_moe",
            op="moe_apply+combine",
            shape=shape,
            dtype=_dtype_name(dtype),
            device=str(device),
            seconds=seconds,
            bytes=nbytes,
            gbps=nbytes / seconds / 1e9,
            samples=len(samples["apply"]),
            verified=err <= 2e-2 and err_c <= 2e-2,
            max_err=max(err, err_c),
            note="vs dense float64 reference (every expert on every token, routing matrix)",
        )
    ]


def _q8_0_bank(rows: int, cols: int, experts: int, gen: torch.Generator) -> torch.Tensor:
    """Random GGML Q8_0 blocks ``(experts, rows, cols/32*34)``: fp16 scale + 32 int8."""
    blocks = experts * rows * (cols // 32)
    d = (torch.rand(blocks, 1, generator=gen) * 0.01 + 0.005).to(torch.float16)
    q = torch.randint(-127, 128, (blocks, 32), generator=gen, dtype=torch.int8)
    raw = torch.cat([d.view(torch.uint8), q.view(torch.uint8)], dim=1)
    return raw.reshape(experts, rows, (cols // 32) * 34)


def ggml_status() -> str | None:
    """None when the GGML method can run here, else why not."""
    if importlib.util.find_spec("sgl_cuda") is None:
        return "sgl-cuda is not installed"
    if torch.cuda.is_available():
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    if "triton" in sys.modules:
        return "no CUDA device and triton was imported without TRITON_INTERPRET=1"
    # Triton reads this when the kernels are defined (on their first launch): CPU
    # tensors then run in its interpreter.
    os.environ["TRITON_INTERPRET"] = "1"
    return None


def check_ggml(device: torch.device, repeats: int) -> list[MoERecord]:
    """``GGMLMoEMethod`` (Q8_0 experts) vs dequantize-then-matmul in float64.

    sgl_cuda is a device package: it is imported here, by name, only when the
    bench runs (sgl_core must not import it statically).
    """
    quant: Any = importlib.import_module("sgl_cuda.quantization")
    on_gpu = device.type == "cuda"
    tokens, hidden, inter, experts, top_k = (64, 2048, 1024, 8, 4) if on_gpu else (4, 64, 32, 4, 2)
    gen = torch.Generator().manual_seed(2)
    gate_up = _q8_0_bank(2 * inter, hidden, experts, gen).to(device)
    down = _q8_0_bank(hidden, inter, experts, gen).to(device)
    bank = quant.GGMLExpertBank(gate_up, 8, down, 8)  # 8 = GGML Q8_0
    x = torch.randn(tokens, hidden, generator=gen).to(device, torch.bfloat16)
    topk_weights, topk_ids = _routing(tokens, experts, top_k, gen, torch.device("cpu"))
    topk_weights, topk_ids = topk_weights.to(device), topk_ids.to(device)
    method = quant.GGMLMoEMethod()
    result: dict[str, torch.Tensor] = {}

    def ggml() -> None:
        result["ggml"] = method.apply(bank, x, topk_weights, topk_ids)

    def dequant_matmul() -> None:
        w13 = quant.dequantize_ggml(gate_up, 8, torch.bfloat16)
        w2 = quant.dequantize_ggml(down, 8, torch.bfloat16)
        result["dequant_matmul"] = TorchMoEMethod().apply(
            MoEWeights(w13, w2), x, topk_weights, topk_ids
        )

    ops = {"ggml": ggml, "dequant_matmul": dequant_matmul}
    samples = time_interleaved(
        ops, warmup=1, repeats=repeats if on_gpu else 1, budget_s=30.0, device=device
    )
    w13 = quant.dequantize_ggml(gate_up, 8, torch.float32)
    w2 = quant.dequantize_ggml(down, 8, torch.float32)
    ref = _dense_moe(x, w13, w2, topk_weights, topk_ids)
    shape = f"T={tokens},H={hidden},I={inter},E={experts},top_k={top_k},Q8_0"
    nbytes = (gate_up.numel() + down.numel()) * gate_up.element_size()
    records: list[MoERecord] = []
    for impl in ops:
        err = float((result[impl].double() - ref).abs().max() / ref.abs().max())
        seconds = median(samples[impl])
        records.append(
            MoERecord(
                impl=impl,
                op="ggml_moe",
                shape=shape,
                dtype="bfloat16",
                device=str(device),
                seconds=seconds,
                bytes=nbytes,
                gbps=nbytes / seconds / 1e9,
                samples=len(samples[impl]),
                verified=err <= 3e-2,
                max_err=err,
                note="" if on_gpu else "Triton interpreter on CPU: correctness only, not speed",
            )
        )
    records[0].speedup = records[1].seconds / records[0].seconds
    return records
