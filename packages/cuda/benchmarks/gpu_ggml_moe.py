"""GGML MoE method vs dequantize-then-matmul, on a DeepSeek-like expert shape.

    # H200 default: H=7168, I=2048, E=256, top_k=8, Q4_K
    python packages/cuda/benchmarks/gpu_ggml_moe.py --json out.json
    TRITON_INTERPRET=1 python packages/cuda/benchmarks/gpu_ggml_moe.py --tiny --device cpu

Both implementations get the same random, valid Q4_K expert banks and routing.
The baseline dequantizes only the experts a batch uses (``dequantize_ggml``)
and runs them as dense bf16 matmuls grouped by expert, the way an engine
without a quantized kernel would. Outputs are compared (relative L2 error; the
GGML path quantizes activations to Q8_1, about 0.5% per stage).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import torch

from sgl_core import silu_and_mul
from sgl_cuda.quantization import GGMLExpertBank, GGMLMoEMethod, GGMLQuantType, dequantize_ggml

Q4_K_BLOCK_BYTES = 144  # 256 weights: f16 d, f16 dmin, 12 B scales, 128 B nibbles


def random_q4_k(
    e: int, rows: int, k: int, device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    """Valid Q4_K bytes ``(e, rows, k/256*144)`` with small finite f16 scales."""
    blocks = torch.randint(
        0,
        256,
        (e, rows, k // 256, Q4_K_BLOCK_BYTES),
        dtype=torch.uint8,
        device=device,
        generator=gen,
    )
    scales = (torch.rand((e, rows, k // 256, 2), device=device, generator=gen) * 2e-3 + 2e-4).half()
    blocks[..., 0:4] = scales.view(torch.uint8).view(e, rows, k // 256, 4)
    return blocks.view(e, rows, -1)


def dense_moe(
    bank: GGMLExpertBank, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    tokens, top_k = ids.shape
    flat = ids.reshape(-1).long()
    out = torch.zeros(tokens * top_k, x.shape[1], dtype=torch.float32, device=x.device)
    for expert in torch.unique(flat).tolist():
        slots = (flat == expert).nonzero().flatten()
        w13 = dequantize_ggml(bank.gate_up[expert], bank.gate_up_type, torch.bfloat16)
        w2 = dequantize_ggml(bank.down[expert], bank.down_type, torch.bfloat16)
        h = silu_and_mul((x[slots // top_k] @ w13.t()).float()).to(torch.bfloat16)
        out[slots] = (h @ w2.t()).float()
    return (out.view(tokens, top_k, -1) * w.float().unsqueeze(-1)).sum(1).to(x.dtype)


def timed(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small shape for a CPU check")
    parser.add_argument("--tokens", default="1,8,32,128")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.tiny:
        h, inter, e, top_k, repeats, token_list = 512, 256, 8, 2, 1, [2]
    else:
        h, inter, e, top_k, repeats = 7168, 2048, 256, 8, 5
        token_list = [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator(device=device).manual_seed(0)
    bank = GGMLExpertBank(
        random_q4_k(e, 2 * inter, h, device, gen),
        GGMLQuantType.Q4_K,
        random_q4_k(e, h, inter, device, gen),
        GGMLQuantType.Q4_K,
    )
    method = GGMLMoEMethod()
    records = []
    for tokens in token_list:
        x = (torch.randn(tokens, h, device=device, generator=gen) * 4).to(torch.bfloat16)
        ids = torch.stack(
            [torch.randperm(e, device=device, generator=gen)[:top_k] for _ in range(tokens)]
        ).int()
        w = torch.softmax(torch.randn(tokens, top_k, device=device, generator=gen), -1)
        ours = method.apply(bank, x, w, ids)
        ref = dense_moe(bank, x, w, ids)
        rel = float((ours.float() - ref.float()).norm() / ref.float().norm())
        t_ours = timed(functools.partial(method.apply, bank, x, w, ids), device, repeats)
        t_ref = timed(functools.partial(dense_moe, bank, x, w, ids), device, repeats)
        rec = {
            "tokens": tokens,
            "hidden": h,
            "intermediate": inter,
            "experts": e,
            "top_k": top_k,
            "quant": "Q4_K",
            "ggml_s": t_ours,
            "dequant_matmul_s": t_ref,
            "ggml_tokens_per_s": tokens / t_ours,
            "dequant_tokens_per_s": tokens / t_ref,
            "speedup": t_ref / t_ours,
            "rel_l2_error": rel,
        }
        records.append(rec)
        print(
            f"T={tokens:5d}  ggml {tokens / t_ours:10.1f} tok/s  dequant+matmul "
            f"{tokens / t_ref:10.1f} tok/s  speedup {t_ref / t_ours:6.2f}x  rel.err {rel:.4f}"
        )
        assert rel < 5e-2, f"GGML output disagrees with the dequantized reference: {rel}"
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "device": str(device),
                    "name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "records": records,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
