"""HiCache L2 bandwidth of the cuda backend's MHA pools vs a pinned ``copy_`` of the same bytes.

Llama-3-8B shape (32 layers, 8 KV heads of 128, bf16). For each page size and
every supported MHA (host layout, io backend) pair: back up the same tokens
from random device pages to host pages (shuffled with ``--shuffle-host``,
else consecutive), all layers in one call, load them back per layer into
other device pages, check every byte, and time each op as ``--reps`` samples
(best and median), interleaved with a contiguous pinned ``copy_`` of the same
bytes measured in the same round (the ratio is what to compare, not GB/s).

    python packages/cuda/benchmarks/gpu_hicache_mha.py out.json --shuffle-host
    TRITON_INTERPRET=1 python packages/cuda/benchmarks/gpu_hicache_mha.py out.json \\
        --device cpu --tiny                                           # logic check on CPU
"""

# ruff: noqa: B023 - the lambdas in loops are called in the same iteration
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch
from gpu_hicache import Clock, gbps, page_tokens

import sgl_cuda
from sgl_core import HostLayout, IOBackend


@dataclass
class Shape:
    layers: int
    heads: int
    head_dim: int
    tokens: int  # moved per call
    page_sizes: list[int]
    reps: int


FULL = Shape(32, 8, 128, 16384, [64, 16], 5)
TINY = Shape(3, 2, 8, 32, [4, 8], 2)


@dataclass
class Row:
    page: int
    layout: str
    io: str
    op: str
    nbytes: int
    best_ms: float
    median_ms: float
    gbps: float
    ratio: float  # best copy_ time / best op time (1.0: as fast as one contiguous copy)
    ratio_median: float
    exact: bool


def _time_pair(
    clock: Clock, op: Any, copy: Any, reps: int, calls: int
) -> tuple[list[float], list[float]]:
    """``reps`` interleaved samples of the op and of the reference copy."""
    op()
    copy()
    ops: list[float] = []
    copies: list[float] = []
    for _ in range(reps):
        ops.append(clock.sample(op, calls))
        copies.append(clock.sample(copy, calls))
    return ops, copies


def bench_page(shape: Shape, page: int, device: torch.device, shuffle: bool) -> list[Row]:
    clock = Clock(device)
    gen = torch.Generator().manual_seed(page)
    backend = sgl_cuda.backend
    n_pages = max(1, shape.tokens // page)
    dev_pages = 2 * n_pages + 2
    dev = backend.create_mha_device_pool(
        size=dev_pages * page, page_size=page, dtype=torch.bfloat16, head_num=shape.heads,
        head_dim=shape.head_dim, layer_num=shape.layers, device=device,
    )  # fmt: skip
    k_layers, v_layers = dev.k_buffer, dev.v_buffer  # type: ignore[attr-defined]
    for layer in (*k_layers, *v_layers):
        layer.view(torch.int16).random_(-(2**15), 2**15)
    perm = torch.randperm(dev_pages - 1, generator=gen)[: 2 * n_pages] + 1  # page 0: padding
    d_idx, d2_idx = page_tokens(perm[:n_pages], page), page_tokens(perm[n_pages:], page)
    row = 2 * shape.heads * shape.head_dim * 2  # K and V, bf16
    all_bytes = d_idx.numel() * row * shape.layers
    staging_d = torch.empty(all_bytes, dtype=torch.uint8, device=device)
    staging_h = torch.empty(all_bytes, dtype=torch.uint8, pin_memory=clock.cuda)
    rows: list[Row] = []
    for layout, ios in backend.supported_mha_pairs.items():
        for io in sorted(ios, key=lambda i: i.value):
            # A fresh (zeroed) host pool and zeroed load targets per pair: the byte
            # check below can only pass on this pair's own copies.
            host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=1.0)
            host_pages = torch.arange(n_pages)
            if shuffle:
                host_pages = torch.randperm(host.size // page, generator=gen)[:n_pages]
            h_idx = page_tokens(host_pages, page)
            for layer in (*k_layers, *v_layers):
                layer[d2_idx.to(device)] = 0

            def backup() -> None:
                host.backup_from_device_all_layer(dev, h_idx, d_idx, io)

            def load() -> None:
                for layer in range(shape.layers):
                    host.load_to_device_per_layer(dev, h_idx, d2_idx, layer, io)

            timings = {
                "backup": _time_pair(
                    clock, backup, lambda: staging_h.copy_(staging_d, non_blocking=True),
                    shape.reps, 1,
                ),
                "load": _time_pair(
                    clock, load, lambda: staging_d.copy_(staging_h, non_blocking=True),
                    shape.reps, 1,
                ),
            }  # fmt: skip
            clock.sync()
            exact = all(
                torch.equal(layers[i][d_idx].view(torch.int16), layers[i][d2_idx].view(torch.int16))
                for layers in (k_layers, v_layers)
                for i in range(shape.layers)
            )
            for op, (t, c) in timings.items():
                rows.append(
                    Row(page, HostLayout(layout).value, IOBackend(io).value, op, all_bytes,
                        min(t), statistics.median(t), gbps(all_bytes, min(t)),
                        min(c) / min(t), statistics.median(c) / statistics.median(t), exact)
                )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", help="JSON file for the rows")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU logic check)")
    parser.add_argument("--shuffle-host", action="store_true", help="random host pages")
    args = parser.parse_args(argv)
    shape = TINY if args.tiny else FULL
    device = torch.device(args.device)
    rows = [
        r for page in shape.page_sizes for r in bench_page(shape, page, device, args.shuffle_host)
    ]
    print(f"{'page':>5} {'layout':<18} {'io':<7} {'op':<7} {'GB/s':>8} {'ratio':>6} "
          f"{'ratio med':>9} exact")  # fmt: skip
    for r in rows:
        print(f"{r.page:>5} {r.layout:<18} {r.io:<7} {r.op:<7} {r.gbps:>8.2f} {r.ratio:>6.2f} "
              f"{r.ratio_median:>9.2f} {r.exact}")  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"shuffle_host": args.shuffle_host, "rows": [asdict(r) for r in rows]}, f)
    return 0 if all(r.exact for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
