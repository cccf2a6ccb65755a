"""HiCache L2 bandwidth of the cuda backend vs a pinned ``copy_`` of the same bytes.

DeepSeek-V3 shape (61 layers, 512 + 64, bf16, page 64). For every supported
(host layout, io backend) pair: back up N random device pages to N random host
pages (all layers, one call), load them back per layer into other device pages
(one call per layer), check every byte, and time both against a contiguous
pinned ``copy_`` of the same number of bytes (device -> host and host -> device).

    python packages/cuda/benchmarks/gpu_hicache.py out.json            # H200: < 2 min
    TRITON_INTERPRET=1 python packages/cuda/benchmarks/gpu_hicache.py out.json \\
        --device cpu --tiny                                            # logic check on CPU

Prints a table and writes the rows as JSON to the path given.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import sgl_cuda
from sgl_core import HostLayout, IOBackend
from sgl_cuda import CudaMLADevicePool, CudaMLAHostPool

_timing_event: Callable[..., torch.cuda.Event] = torch.cuda.Event


@dataclass
class Row:
    layout: str
    io: str
    op: str  # backup_all_layers | load_all_layers | load_one_layer
    nbytes: int
    ms: float
    gbps: float
    copy_gbps: float
    ratio: float
    exact: bool


@dataclass
class Shape:
    layers: int
    kv_lora_rank: int
    rope: int
    page_size: int
    device_pages: int
    host_ratio: float
    move_pages: int
    iters: int


FULL = Shape(61, 512, 64, 64, 2000, 2.0, 256, 5)
TINY = Shape(3, 16, 8, 4, 12, 2.0, 4, 1)


class Timer:
    """Wall time of GPU work via CUDA events (or perf_counter on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, fn: Callable[[], object], iters: int) -> float:
        fn()  # warm-up (Triton compile, allocator)
        self.sync()
        if self.cuda:
            start, end = _timing_event(enable_timing=True), _timing_event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters


def page_tokens(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    return (pages[:, None] * page_size + torch.arange(page_size)).flatten()


def host_rows_at(host: CudaMLAHostPool, layer: int, h_idx: torch.Tensor) -> torch.Tensor:
    """Rows ``(n, 1, dim)`` of one host layer at token indices, as a CPU copy."""
    rows = host.host_rows(layer)
    if rows is not None:
        return rows.index_select(0, h_idx)
    ps = host.page_size
    page_rows = host.kv_buffer[h_idx[::ps] // ps, layer]  # (pages, ps, 1, dim)
    return page_rows.reshape(-1, 1, host.kv_cache_dim)


def copy_baseline(
    nbytes: int, device: torch.device, timer: Timer, iters: int
) -> tuple[float, float]:
    """(D2H, H2D) GB/s of one contiguous pinned copy_ of ``nbytes``."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    d2h = timer.ms(lambda: host.copy_(dev, non_blocking=True), iters)
    h2d = timer.ms(lambda: dev.copy_(host, non_blocking=True), iters)
    return nbytes / d2h / 1e6, nbytes / h2d / 1e6


def bench_pair(
    dev: CudaMLADevicePool,
    layout: HostLayout,
    io: IOBackend,
    shape: Shape,
    timer: Timer,
    baselines: dict[int, tuple[float, float]],
    gen: torch.Generator,
) -> list[Row]:
    ps = shape.page_size
    host = sgl_cuda.backend.create_host_pool(
        dev, layout=layout, host_to_device_ratio=shape.host_ratio, io_backend=io
    )
    n = shape.move_pages
    # Device pages 1.. (page 0 is padding): two disjoint sets, shuffled; host pages shuffled.
    dev_perm = torch.randperm(shape.device_pages, generator=gen)[: 2 * n] + 1
    src_pages, dst_pages = dev_perm[:n], dev_perm[n:]
    host_pages = torch.randperm(host.page_num, generator=gen)[:n]
    d_idx, d2_idx, h_idx = (page_tokens(p, ps) for p in (src_pages, dst_pages, host_pages))
    row_bytes = host.shape.token_stride_size
    all_bytes = d_idx.numel() * row_bytes * shape.layers
    layer_bytes = d_idx.numel() * row_bytes

    def backup() -> None:
        host.backup_from_device_all_layer(dev, h_idx, d_idx, io)

    def load_all() -> None:
        for layer in range(shape.layers):
            host.load_to_device_per_layer(dev, h_idx, d2_idx, layer, io)

    def load_one() -> None:
        host.load_to_device_per_layer(dev, h_idx, d2_idx, shape.layers // 2, io)

    backup_ms = timer.ms(backup, shape.iters)
    host.synchronize()
    d_dev = d_idx.to(dev.device)
    exact_backup = all(
        torch.equal(
            host_rows_at(host, layer, h_idx).view(torch.int16),
            dev.kv_buffer[layer].index_select(0, d_dev).cpu().view(torch.int16),
        )
        for layer in range(shape.layers)
    )
    # Scramble the load targets so the check below means something.
    for layer in range(shape.layers):
        dev.kv_buffer[layer][d2_idx.to(dev.device)] = 0
    load_all_ms = timer.ms(load_all, max(1, shape.iters // 2))
    timer.sync()
    d2_dev = d2_idx.to(dev.device)
    exact_load = all(
        torch.equal(
            dev.kv_buffer[layer].index_select(0, d2_dev).view(torch.int16),
            dev.kv_buffer[layer].index_select(0, d_dev).view(torch.int16),
        )
        for layer in range(shape.layers)
    )
    load_one_ms = timer.ms(load_one, shape.iters)
    rows = []
    for op, nbytes, ms, exact, direction in (
        ("backup_all_layers", all_bytes, backup_ms, exact_backup, 0),
        ("load_all_layers", all_bytes, load_all_ms, exact_load, 1),
        ("load_one_layer", layer_bytes, load_one_ms, exact_load, 1),
    ):
        gbps = nbytes / ms / 1e6
        copy = baselines[nbytes][direction]
        rows.append(Row(layout.value, io.value, op, nbytes, ms, gbps, copy, gbps / copy, exact))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out", help="where to write the result rows (JSON)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (interpreter)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU logic check)")
    parser.add_argument("--pages", type=int, default=None, help="pages moved per call")
    parser.add_argument("--iters", type=int, default=None)
    args = parser.parse_args(argv)

    shape = TINY if args.tiny else FULL
    if args.pages:
        shape.move_pages = args.pages
    if args.iters:
        shape.iters = args.iters
    device = torch.device(args.device)
    timer = Timer(device)
    gen = torch.Generator().manual_seed(0)
    t_start = time.perf_counter()

    dev = sgl_cuda.backend.create_device_pool(
        size=shape.device_pages * shape.page_size,
        page_size=shape.page_size,
        dtype=torch.bfloat16,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.rope,
        layer_num=shape.layers,
        device=device,
    )
    for layer in dev.kv_buffer:  # random bit patterns, generated on the device
        layer.view(torch.int16).random_(-(2**15), 2**15)
    timer.sync()

    row_bytes = dev.kv_cache_dim * 2
    moved = shape.move_pages * shape.page_size * row_bytes
    baselines = {
        moved * shape.layers: copy_baseline(moved * shape.layers, device, timer, shape.iters),
        moved: copy_baseline(moved, device, timer, shape.iters),
    }

    rows: list[Row] = []
    for layout, ios in sgl_cuda.backend.supported_pairs.items():
        for io in sorted(ios, key=lambda m: m.value):
            pair_start = time.perf_counter()
            rows.extend(bench_pair(dev, layout, io, shape, timer, baselines, gen))
            print(
                f"  {layout.value}/{io.value}: {time.perf_counter() - pair_start:.1f}s",
                file=sys.stderr,
            )

    header = (
        f"{'layout':<18}{'io':<8}{'op':<19}{'MB':>9}{'ms':>9}{'GB/s':>8}{'copy':>8}{'ratio':>7}"
        "  exact"
    )
    print(header)
    for r in rows:
        print(
            f"{r.layout:<18}{r.io:<8}{r.op:<19}{r.nbytes / 1e6:>9.1f}{r.ms:>9.3f}"
            f"{r.gbps:>8.2f}{r.copy_gbps:>8.2f}{r.ratio:>7.2f}  {r.exact}"
        )
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "shape": asdict(shape),
        "seconds": time.perf_counter() - t_start,
    }
    with open(args.json_out, "w", encoding="utf-8") as out:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, out, indent=2)
    ok = all(r.exact for r in rows)
    print(f"{'all bit-exact' if ok else 'MISMATCH'}; {meta['seconds']:.1f}s; wrote {args.json_out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
