"""The ``hicache`` subcommand: choose backends and cases, run them, report."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch

from sgl_core._cli._hicache import Case, HicacheConfig, list_cases, run_case
from sgl_core._cli._report import Progress, Record, machine_info, print_table, write_json
from sgl_core._discovery import available_backends, get_backend
from sgl_core._enums import HostLayout
from sgl_core._protocols import Backend

__all__ = ["add_parser", "run"]

FULL_PAGE_SIZES = [1, 16, 64, 128]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive ints, got {text!r}")
    return values


def _layouts(text: str) -> set[HostLayout]:
    try:
        return {HostLayout.parse(v, argument="--layout") for v in text.split(",") if v.strip()}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "hicache",
        help="host KV-cache backup/load bandwidth vs a contiguous copy and baselines",
        description=(
            "Back up (device->host, all layers, one call) and load (host->device, one call per "
            "layer) a batch of random device pages on a DeepSeek-V3-shaped MLA pool, verify the "
            "round trip bit for bit, and compare GB/s with one contiguous copy of the same bytes "
            "and with plain per-token / per-page baselines. Without options: the default "
            "backend, page size 64, one quick pass."
        ),
    )
    p.add_argument("--backend", help="backend name(s), comma-separated, or 'all'")
    p.add_argument("--layout", type=_layouts, help="host layout(s), comma-separated")
    p.add_argument("--page-size", type=_int_list, help="page sizes, e.g. 1,16,64,128")
    p.add_argument("--pages", type=int, help="pages per transfer (default: 4096 tokens' worth)")
    p.add_argument("--quick", action="store_true", help="small batch, few repeats (< 1 minute)")
    p.add_argument("--full", action="store_true", help="all backends, page sizes 1,16,64,128")
    p.add_argument("--json", metavar="PATH", help="write {machine, records} as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of GB/s by page size")
    p.add_argument("--no-baselines", action="store_true", help="skip per_token/per_page")
    p.add_argument("--shuffle-host", action="store_true", help="random host pages, not alloc()")
    p.add_argument("--device", help="torch device of the device pool (default: backend's)")
    # test and tuning knobs
    p.add_argument("--layers", type=int, default=61, help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    p.add_argument("--kv-lora-rank", type=int, default=512, help=argparse.SUPPRESS)
    p.add_argument("--rope-dim", type=int, default=64, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def select_backends(spec: str | None, notes: list[str]) -> list[Backend]:
    if spec is None:
        return [get_backend()]
    names = available_backends() if spec.strip().lower() == "all" else spec.split(",")
    chosen: list[Backend] = []
    for raw in names:
        backend = get_backend(raw.strip())
        cpu_only = not backend.is_available()
        if cpu_only and backend.name == "cuda":
            if spec.strip().lower() == "all":
                notes.append(
                    "skipped backend 'cuda': no CUDA device here (its Triton kernels run on CPU "
                    "only under TRITON_INTERPRET=1, far too slowly to benchmark; "
                    "run `TRITON_INTERPRET=1 sgl-bench hicache --backend cuda --pages 2` "
                    "to exercise it)"
                )
                continue
            notes.append("backend 'cuda' without a CUDA device: Triton interpreter, CPU tensors")
        elif cpu_only:
            notes.append(f"backend {backend.name!r}: its device is not available; CPU tensors")
        chosen.append(backend)
    return chosen


def make_config(args: argparse.Namespace) -> tuple[HicacheConfig, list[int], bool]:
    selected = args.backend is not None or args.page_size is not None or args.layout is not None
    quick = args.quick or not (args.full or selected)
    page_sizes = args.page_size or (FULL_PAGE_SIZES if args.full else [64])
    cfg = HicacheConfig(
        layers=args.layers,
        kv_lora_rank=args.kv_lora_rank,
        qk_rope_head_dim=args.rope_dim,
        tokens=args.tokens or (2048 if quick else 4096),
        pages=args.pages,
        warmup=1 if args.warmup is None else args.warmup,
        repeats=args.repeats or (3 if quick else 5),
        budget_s=args.budget or (1.0 if quick else 4.0),
        baselines=() if args.no_baselines else ("per_token", "per_page"),
        shuffle_host=args.shuffle_host,
        device=args.device,
    )
    return cfg, page_sizes, quick


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def summarize(records: list[Record]) -> tuple[list[str], list[list[str]]]:
    header = ["backend", "layout/io", "page", "dir", "sgl GB/s", "copy GB/s", "sgl/copy"]
    baselines = sorted({r.impl for r in records} - {"sgl", "copy"})
    header += [f"{b} GB/s" for b in baselines] + [f"x {b}" for b in baselines] + ["bit-exact"]
    rows: list[list[str]] = []
    for r in records:
        if r.impl != "sgl":
            continue
        key = (r.backend, r.layout, r.io_backend, r.page_size, r.direction)
        base = {
            b.impl: b
            for b in records
            if (b.backend, b.layout, b.io_backend, b.page_size, b.direction) == key
        }
        rows.append(
            [r.backend, f"{r.layout}/{r.io_backend}", str(r.page_size), r.direction]
            + [_fmt(r.gbps), _fmt(r.copy_gbps), _fmt(r.ratio)]
            + [_fmt(base[b].gbps) if b in base else "-" for b in baselines]
            + [_fmt(r.gbps / base[b].gbps) if b in base else "-" for b in baselines]
            + ["yes" if all(b.bit_exact is not False for b in base.values()) else "NO"]
        )
    return header, rows


def target_lines(records: list[Record]) -> list[str]:
    sgl = [r for r in records if r.impl == "sgl"]
    lines: list[str] = []
    goals: list[tuple[str, Callable[[Record], bool], float]] = [
        ("page >= 16: sgl >= 0.8x copy", lambda r: r.page_size >= 16, 0.8),
        ("page 1: sgl >= 0.3x copy", lambda r: r.page_size == 1, 0.3),
    ]
    for label, pick, goal in goals:
        mine = [r for r in sgl if pick(r)]
        if mine:
            worst = min(mine, key=lambda r: r.ratio)
            ok = worst.ratio >= goal
            lines.append(
                f"target {label}: {'met' if ok else 'NOT met'} (worst {worst.ratio:.2f}x: "
                f"{worst.backend} {worst.layout}/{worst.io_backend} page {worst.page_size} "
                f"{worst.direction})"
            )
    tok = {
        (r.backend, r.layout, r.io_backend, r.direction): r
        for r in records
        if r.impl == "per_token" and r.page_size == 64
    }
    speedups = [
        r.gbps / tok[(r.backend, r.layout, r.io_backend, r.direction)].gbps
        for r in sgl
        if r.page_size == 64 and (r.backend, r.layout, r.io_backend, r.direction) in tok
    ]
    if speedups:
        ok = min(speedups) >= 3.0
        lines.append(
            f"target page 64: sgl >= 3x per_token: {'met' if ok else 'NOT met'} "
            f"(min {min(speedups):.1f}x)"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    backends = select_backends(args.backend or ("all" if args.full else None), notes)
    cfg, page_sizes, quick = make_config(args)
    cases: list[Case] = list_cases(backends, args.layout, page_sizes)
    for note in notes:
        print(f"note: {note}")
    if not cases:
        print("sgl-bench: error: no (backend, layout, io backend) case matches", file=sys.stderr)
        return 2
    print(
        f"sgl-bench hicache: {len(cases)} case(s), {cfg.layers} layers x "
        f"({cfg.kv_lora_rank}+{cfg.qk_rope_head_dim}) {str(cfg.dtype).removeprefix('torch.')}, "
        f"{'quick' if quick else 'full'} ({cfg.repeats} repeats after {cfg.warmup} warm-up, "
        f"medians, interleaved); torch threads {torch.get_num_threads()}"
    )
    started = time.perf_counter()
    progress = Progress(len(cases) * (cfg.warmup + cfg.repeats), "hicache")
    records: list[Record] = []
    try:
        for case in cases:
            progress.describe(case.label)
            records.extend(run_case(case, cfg, progress))
    finally:
        progress.close()
    header, rows = summarize(records)
    first = records[0]
    print_table(
        f"host pool transfers: {first.tokens} tokens per call ({first.bytes / 1e6:.0f} MB at the "
        f"first case), GB/s (higher is better)",
        header,
        rows,
    )
    for line in target_lines(records):
        print(line)
    exact = all(r.bit_exact is not False for r in records)
    print(f"bit-exact: {'yes' if exact else 'NO'}")
    print(f"wall time: {time.perf_counter() - started:.1f} s")
    if args.json:
        write_json(args.json, machine_info(), records, command="hicache", quick=quick)
        print(f"wrote {args.json}")
    if args.plot:
        from sgl_core._cli._plot import plot_hicache

        plot_hicache(records, args.plot)
        print(f"wrote {args.plot}")
    return 0 if exact else 1
