"""GGML MoE: batched (expert-grouped) vs vec kernel vs dequantize-then-matmul.

    # H200 default: H=7168, I=2048, E=256, top_k=8; Q4_K and Q8_0; < 150 s
    python packages/cuda/benchmarks/gpu_ggml_moe.py --json out.json
    TRITON_INTERPRET=1 python packages/cuda/benchmarks/gpu_ggml_moe.py --tiny --device cpu

For each quant type the same random, valid expert banks and routing go through
``GGMLMoEMethod`` forced onto the batched path (``batched_threshold=0``), forced
onto the vec path, and a baseline that dequantizes only the experts a batch
uses (``dequantize_ggml``) and runs them as dense bf16 matmuls grouped by
expert. Reported per token count: tokens/s of each, the batched/vec ratio, and
the bytes of *distinct* expert weights (gate_up + down of every expert the
batch touches) per second of each kernel path. Outputs are checked against
each other: batched vs vec share the Q8_1 numerics (tight bound), both vs the
baseline differ by the Q8_1 activation rounding (about 0.5% per stage).

Then, while the time budget allows, a sweep of batched tiles
``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)`` at the larger token counts; every
measurement lands in the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from sgl_core import silu_and_mul
from sgl_cuda.quantization import GGMLExpertBank, GGMLMoEMethod, GGMLQuantType, dequantize_ggml
from sgl_cuda.quantization._types import block_format

Tile = tuple[int, int, int, int]
_event: Callable[..., torch.cuda.Event] = torch.cuda.Event
Case = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # x, topk weights, topk ids
Measured = tuple[GGMLExpertBank, dict[int, Case], int]  # bank, cases by T, bytes/expert
# f16 scale offsets inside a block, per type (the rest of the bytes: any value is valid)
_F16_OFFSETS = {GGMLQuantType.Q4_K: (0, 2), GGMLQuantType.Q8_0: (0,)}
SWEEP_TILES: list[Tile] = [  # each type's default tile is skipped (measured already)
    (16, 128, 32, 4),
    (16, 128, 64, 4),
    (16, 256, 32, 4),
    (16, 256, 64, 4),
    (32, 128, 32, 4),
    (32, 256, 32, 8),
    (64, 128, 32, 8),
]
SWEEP_TOKENS = (128, 512, 2048)


def random_bank(
    qtype: GGMLQuantType, e: int, rows: int, k: int, device: torch.device, gen: torch.Generator
) -> torch.Tensor:
    """Valid ``qtype`` bytes ``(e, rows, row_bytes(k))`` with small finite f16 scales."""
    fmt = block_format(qtype)
    nb = k // fmt.block_size
    blocks = torch.randint(
        0, 256, (e, rows, nb, fmt.block_bytes), dtype=torch.uint8, device=device, generator=gen
    )
    for off in _F16_OFFSETS[qtype]:
        scales = (torch.rand((e, rows, nb, 1), device=device, generator=gen) * 2e-3 + 2e-4).half()
        blocks[..., off : off + 2] = scales.view(torch.uint8)
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


def timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median seconds of ``iters`` calls (CUDA events on a GPU).

    Callers have just run ``fn`` once for its output (compiles included), which
    is the warm-up.
    """
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = _event(enable_timing=True), _event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


def errors(a: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    a, ref = a.float(), ref.float()
    diff = a - ref
    return {
        "rel_l2": float(diff.norm() / ref.norm()),
        "max_rel": float(diff.abs().max() / ref.abs().max()),
    }


def bench_type(
    qtype: GGMLQuantType,
    shape: tuple[int, int, int, int],
    token_list: list[int],
    device: torch.device,
    iters: int,
    records: list[dict[str, object]],
    save: Callable[[], None],
) -> Measured:
    """Batched vs vec vs dequant+matmul at every token count; the bank and cases."""
    h, inter, e, top_k = shape
    gen = torch.Generator(device=device).manual_seed(int(qtype))
    bank = GGMLExpertBank(
        random_bank(qtype, e, 2 * inter, h, device, gen),
        qtype,
        random_bank(qtype, e, h, inter, device, gen),
        qtype,
    )
    expert_bytes = (bank.gate_up[0].numel() + bank.down[0].numel()) * 1  # uint8
    batched, vec = GGMLMoEMethod(batched_threshold=0), GGMLMoEMethod(batched_threshold=1 << 62)
    cases: dict[int, Case] = {}
    for tokens in token_list:
        x = (torch.randn(tokens, h, device=device, generator=gen) * 4).to(torch.bfloat16)
        ids = torch.stack(
            [torch.randperm(e, device=device, generator=gen)[:top_k] for _ in range(tokens)]
        ).int()
        w = torch.softmax(torch.randn(tokens, top_k, device=device, generator=gen), -1)
        cases[tokens] = (x, w, ids)
        distinct = int(torch.unique(ids).numel()) * expert_bytes
        t0 = time.perf_counter()
        y_b = batched.apply(bank, x, w, ids)
        first_call_s = time.perf_counter() - t0
        y_v = vec.apply(bank, x, w, ids)
        y_d = dense_moe(bank, x, w, ids)
        e_bv, e_bd, e_vd = errors(y_b, y_v), errors(y_b, y_d), errors(y_v, y_d)
        t_b = timed(lambda: batched.apply(bank, x, w, ids), device, iters)  # noqa: B023
        t_v = timed(lambda: vec.apply(bank, x, w, ids), device, iters)  # noqa: B023
        t_d = timed(lambda: dense_moe(bank, x, w, ids), device, max(1, iters // 2))  # noqa: B023
        rec: dict[str, object] = {
            "quant": qtype.name,
            "tokens": tokens,
            "hidden": h,
            "intermediate": inter,
            "experts": e,
            "top_k": top_k,
            "experts_touched": distinct // expert_bytes,
            "distinct_weight_bytes": distinct,
            "batched_s": t_b,
            "vec_s": t_v,
            "dequant_matmul_s": t_d,
            "batched_tokens_per_s": tokens / t_b,
            "vec_tokens_per_s": tokens / t_v,
            "dequant_tokens_per_s": tokens / t_d,
            "batched_over_vec": t_v / t_b,
            "default_method_path": "batched"
            if tokens > GGMLMoEMethod().batched_threshold
            else "vec",
            "batched_weight_gb_per_s": distinct / t_b / 1e9,
            "vec_weight_gb_per_s": distinct / t_v / 1e9,
            "batched_first_call_s": first_call_s,
            "err_batched_vs_vec": e_bv,
            "err_batched_vs_dequant": e_bd,
            "err_vec_vs_dequant": e_vd,
        }
        records.append(rec)
        save()
        print(
            f"{qtype.name} T={tokens:5d}  batched {tokens / t_b:9.0f} tok/s "
            f"({distinct / t_b / 1e9:7.1f} GB/s)  vec {tokens / t_v:9.0f} tok/s "
            f"({distinct / t_v / 1e9:7.1f} GB/s)  dequant+mm {tokens / t_d:8.0f} tok/s  "
            f"b/v {t_v / t_b:5.2f}x  err b-v {e_bv['max_rel']:.1e} b-d {e_bd['rel_l2']:.1e}",
            flush=True,
        )
        assert e_bv["rel_l2"] < 5e-3, f"batched and vec paths disagree: {e_bv}"
        assert e_bd["rel_l2"] < 5e-2 and e_vd["rel_l2"] < 5e-2, (e_bd, e_vd)

    return bank, cases, expert_bytes


def sweep_tiles(
    qtype: GGMLQuantType,
    measured: Measured,
    tiles: list[Tile],
    device: torch.device,
    iters: int,
    deadline: float,
    sweeps: list[dict[str, object]],
    save: Callable[[], None],
) -> None:
    """Time batched ``tiles`` at the larger token counts while time is left."""
    bank, cases, expert_bytes = measured
    batched = GGMLMoEMethod(batched_threshold=0)
    sweep_tokens = [t for t in SWEEP_TOKENS if t in cases] or [max(cases)]
    for tile in tiles:
        if time.perf_counter() > deadline:
            print(f"{qtype.name}: time budget spent, sweep stopped before {tile}")
            break
        method = GGMLMoEMethod(batched_threshold=0, tile=tile)
        for tokens in sweep_tokens:
            x, w, ids = cases[tokens]
            ref = batched.apply(bank, x, w, ids)
            try:
                err = errors(method.apply(bank, x, w, ids), ref)
            except Exception as exc:  # a tile that fails to compile is a result too
                sweeps.append({"quant": qtype.name, "tile": list(tile), "error": repr(exc)})
                save()
                print(f"{qtype.name} tile {tile}: {exc!r}", flush=True)
                break
            t = timed(lambda: method.apply(bank, x, w, ids), device, iters)  # noqa: B023
            distinct = int(torch.unique(ids).numel()) * expert_bytes
            sweeps.append(
                {
                    "quant": qtype.name,
                    "tokens": tokens,
                    "tile": list(tile),
                    "batched_s": t,
                    "batched_tokens_per_s": tokens / t,
                    "batched_weight_gb_per_s": distinct / t / 1e9,
                    "err_vs_default_tile": err,
                }
            )
            save()
            print(
                f"{qtype.name} T={tokens:5d} tile {tile}: {tokens / t:9.0f} tok/s "
                f"({distinct / t / 1e9:7.1f} GB/s) err {err['max_rel']:.1e}",
                flush=True,
            )
            assert err["rel_l2"] < 5e-3, f"tile {tile} disagrees with the default: {err}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small shape for a CPU logic check")
    parser.add_argument("--tokens", default="1,8,32,64,128,512,2048")
    parser.add_argument("--quants", default="Q4_K,Q8_0")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--no-sweep", action="store_true", help="skip the batched tile sweep")
    parser.add_argument(
        "--budget-s", type=float, default=100.0, help="start no sweep tile after this many s"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    start = time.perf_counter()
    if args.tiny:
        shape, token_list, iters = (256, 256, 4, 2), [3], 1
    else:
        shape, iters = (7168, 2048, 256, 8), 3
        token_list = [int(t) for t in args.tokens.split(",")]
    iters = args.iters or iters
    records: list[dict[str, object]] = []
    sweeps: list[dict[str, object]] = []
    quants = [GGMLQuantType[q] for q in args.quants.split(",")]

    def save() -> None:
        """Rewrite the JSON after every measurement: a run cut short keeps its rows."""
        if not args.json:
            return
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "device": str(device),
                    "name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "default_tiles": {q.name: list(_default_tile(q)) for q in quants},
                    "total_s": time.perf_counter() - start,
                    "records": records,
                    "tile_sweep": sweeps,
                },
                f,
                indent=2,
            )

    # every type's main table first, then tile sweeps in what is left of the budget
    measured = {q: bench_type(q, shape, token_list, device, iters, records, save) for q in quants}
    # tile by tile across the types, so a spent budget cuts every type's sweep alike;
    # a CPU logic check tries one tile (64-wide K steps: Q4_K's own decode path)
    tiles = [SWEEP_TILES[1]] if device.type == "cpu" else SWEEP_TILES
    for tile in [] if args.no_sweep else tiles:
        for qtype in quants:
            if tile != _default_tile(qtype):
                deadline = start + args.budget_s
                sweep_tiles(qtype, measured[qtype], [tile], device, iters, deadline, sweeps, save)
    save()
    print(f"total {time.perf_counter() - start:.1f} s")


def _default_tile(qtype: GGMLQuantType) -> Tile:
    from sgl_cuda._triton.ggml import default_tile

    return default_tile(int(qtype))


if __name__ == "__main__":
    main()
