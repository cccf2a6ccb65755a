"""Tile sweep for the GGML MoE GEMV kernel (``sgl_cuda._triton.ggml``).

    python packages/cuda/benchmarks/ggml_tune.py --json tune.json   # H200: ~2 min
    TRITON_INTERPRET=1 python packages/cuda/benchmarks/ggml_tune.py --tiny --device cpu

Times ``_moe_a8_vec_kernel`` alone (no quantize/activation/combine) for each
``(BLOCK_N, BLOCK_K, num_warps)`` on DeepSeek-like expert shapes: gate_up
(N=4096, K=7168) and down (N=7168, K=2048), at 1 and 32 tokens with top_k 8.
Every config's output is checked against that of the library's current tile
for the type (same integer dot products; only the float summation order
differs). Reports each config's time relative to that tile, and the weight
bytes the kernel reads per second, for comparison with the HBM bandwidth.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time

import torch
import triton
import triton.testing

from sgl_cuda._triton import ggml as kernels
from sgl_cuda.quantization._types import GGMLQuantType, block_format


def random_blocks(
    qtype: GGMLQuantType, e: int, n: int, k: int, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    fmt = block_format(qtype)
    raw = torch.randint(
        0,
        256,
        (e, n, k // fmt.block_size, fmt.block_bytes),
        dtype=torch.uint8,
        generator=gen,
        device=device,
    )
    # small finite f16 scales in the leading bytes (d, and dmin for the _K/_1 types)
    scales = (
        (torch.rand((e, n, k // fmt.block_size, 2), generator=gen, device=device) * 2e-3 + 2e-4)
        .half()
        .view(torch.uint8)
        .view(e, n, k // fmt.block_size, 4)
    )
    if qtype is GGMLQuantType.Q6_K:
        raw[..., -2:] = scales[..., :2]
    else:
        raw[..., :4] = scales
    return raw.view(e, n, -1)


def run_kernel(
    qtype: GGMLQuantType,
    xq: torch.Tensor,
    xd: torch.Tensor,
    w: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    top_k: int,
    config: tuple[int, int, int],
) -> None:
    """``out[p] = dequant(w[ids[p]]) @ dequant(x[p // top_k])`` with one tile config."""
    fmt = block_format(qtype)
    kernels.moe_a8_vec(
        xq,
        xd,
        w,
        ids,
        out,
        top_k=top_k,
        quant_type=int(qtype),
        block_size=fmt.block_size,
        block_bytes=fmt.block_bytes,
        group_size=fmt.group_size,
        tile=config,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--budget-s", type=float, default=150.0)
    args = parser.parse_args()
    device = torch.device(args.device)
    started = time.perf_counter()
    if args.tiny:
        shapes, tokens_list, experts = [("gate_up", 64, 512)], [1], 4
        configs = [(16, 256, 4), (32, 256, 4)]
    else:
        shapes = [("gate_up", 4096, 7168), ("down", 7168, 2048)]
        tokens_list, experts = [1, 32], 16
        configs = [
            (bn, bk, nw)
            for bn, bk, nw in itertools.product((4, 8, 16, 32, 64), (256, 512), (2, 4, 8))
            if bn * bk <= 16384
        ]
    top_k = 8 if not args.tiny else 2
    gen = torch.Generator(device=device).manual_seed(0)
    records = []
    for qtype in (GGMLQuantType.Q4_K, GGMLQuantType.Q8_0):
        fmt = block_format(qtype)
        # the library's current tile for this type goes first: the baseline
        tile_n, warps = kernels._GPU_TILES.get(int(qtype), kernels._GPU_TILE_DEFAULT)
        default = (tile_n, 256, warps)
        configs = [default] + [c for c in configs if c != default]
        for (name, n, k), tokens in itertools.product(shapes, tokens_list):
            w = random_blocks(qtype, experts, n, k, gen, device)
            x = torch.randn(tokens, k, generator=gen, device=device) * 4
            xq, xd = kernels.quantize_q8_1(x)
            ids = torch.randint(0, experts, (tokens * top_k,), generator=gen, device=device)
            ids = ids.to(torch.int32)
            pairs = tokens * top_k
            touched = len(torch.unique(ids)) * n * (k // fmt.block_size) * fmt.block_bytes
            want = None
            base_ms = None
            for bn, bk, nw in configs:
                if time.perf_counter() - started > args.budget_s:
                    print("budget spent; stopping")
                    break
                out = torch.empty(pairs, n, dtype=torch.float32, device=device)

                launch = functools.partial(
                    run_kernel,
                    qtype,
                    xq,
                    xd,
                    w,
                    ids,
                    out,
                    top_k,
                    (bn, bk, nw),
                )

                try:
                    launch()
                except Exception as exc:  # a config that fails to compile is skipped
                    print(f"{qtype.name} {name} T={tokens} {(bn, bk, nw)}: {type(exc).__name__}")
                    continue
                if want is None:
                    want = out.clone()
                err = float((out - want).abs().max() / want.abs().max().clamp_min(1e-30))
                if args.device == "cpu":
                    ms = 0.0
                else:
                    ms = float(triton.testing.do_bench(launch, warmup=10, rep=40))
                if base_ms is None:
                    base_ms = ms
                rec = {
                    "qtype": qtype.name,
                    "shape": name,
                    "n": n,
                    "k": k,
                    "tokens": tokens,
                    "block_n": bn,
                    "block_k": bk,
                    "num_warps": nw,
                    "ms": ms,
                    "vs_default": (base_ms / ms) if ms else 0.0,
                    "weight_gb_s": touched / ms / 1e6 if ms else 0.0,
                    "max_rel_err": err,
                }
                records.append(rec)
                print(
                    f"{qtype.name} {name:7s} T={tokens:3d} BN={bn:3d} BK={bk:4d} W={nw} "
                    f"{ms:8.4f} ms  x{rec['vs_default']:.2f}  {rec['weight_gb_s']:7.1f} GB/s"
                    f"  err {err:.1e}"
                )
                assert err < 1e-4, "config disagrees with the default config"
    best: dict[str, dict[str, object]] = {}
    best_ms: dict[str, float] = {}
    for rec in records:
        key = f"{rec['qtype']}/{rec['shape']}/T{rec['tokens']}"
        ms = float(rec["ms"])  # type: ignore[arg-type]
        if ms and ms < best_ms.get(key, float("inf")):
            best[key], best_ms[key] = rec, ms
    for key, rec in best.items():
        print(
            f"best {key}: BN={rec['block_n']} BK={rec['block_k']} W={rec['num_warps']} "
            f"x{rec['vs_default']:.2f} {rec['weight_gb_s']:.0f} GB/s"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"records": records, "best": best}, f, indent=1)


if __name__ == "__main__":
    main()
