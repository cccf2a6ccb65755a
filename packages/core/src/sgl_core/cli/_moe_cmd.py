"""The ``moe`` subcommand: combine timing and MoE method checks."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch

from sgl_core.cli._checks import EXIT_STATUS, CliParser, check_args, check_memory
from sgl_core.cli._moe_bench import (
    MoERecord,
    bench_combine,
    check_case,
    check_torch_moe,
)
from sgl_core.cli._report import interpreted_note, print_table, pyplot, write_outputs
from sgl_core.errors import BackendUnavailableError
from sgl_core.moe._bench_case import moe_bench_factories

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[CliParser]) -> None:
    p = sub.add_parser(
        "moe",
        help="MoE combine (fused vs unfused) and MoE method checks",
        description=(
            "Time the routed/shared combine (fused shared.add_(routed, alpha=s) vs unfused "
            "routed.mul_(s) then add) at T=4096, H=7168 bf16, check the reference torch MoE "
            "method against a dense float64 computation, and check the GGML method when "
            "sgl-cuda is installed (on CPU: Triton interpreter at a tiny shape)."
        ),
        epilog=EXIT_STATUS,
    )
    p.add_argument("--quick", action="store_true", help="smaller combine shape, fewer repeats")
    p.add_argument("--json", metavar="PATH", help="write {machine, records} as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of ms per call")
    p.add_argument(
        "--no-device-methods",
        action="store_true",
        help="skip MoE methods registered by device packages (sgl.moe_bench_cases)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if present)")
    p.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, help="timed repeats (default: 5 quick, 11)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    device = check_args(args, ("tokens", "hidden", "repeats"))
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokens = args.tokens or (1024 if args.quick else 4096)
    hidden = args.hidden or 7168
    repeats = args.repeats or (5 if args.quick else 11)
    # routed, shared, a saved copy of each (bf16), two float64 references
    check_memory("--tokens/--hidden", tokens * hidden * (4 * 2 + 2 * 8), "the combine", device)
    started = time.perf_counter()
    records = bench_combine(tokens, hidden, torch.bfloat16, device, repeats)
    small = (16, 256, 128, 8, 2) if args.quick else (64, 1024, 256, 16, 4)
    records += check_torch_moe(*small, device)
    notes: list[str] = []
    if args.no_device_methods:
        notes.append("device packages' MoE methods: skipped (--no-device-methods)")
    else:
        for name, factory in sorted(moe_bench_factories().items()):  # device packages' cases
            try:
                case = factory(device, args.quick)
            except BackendUnavailableError as exc:
                notes.append(f"{name}: {exc}")
                continue
            records += check_case(case, device, repeats)
    header = ["op", "impl", "shape", "device", "ms", "GB/s", "speedup", "rel err", "verified"]
    rows = [
        [
            r.op,
            f"{r.impl}*" if r.interpreted else r.impl,
            r.shape,
            r.device,
            f"{r.seconds * 1e3:.3f}",
            f"{r.gbps:.2f}",
            "-" if r.speedup is None else f"{r.speedup:.2f}x",
            "-" if r.max_err is None else f"{r.max_err:.1e}",
            {True: "yes", False: "NO", None: "-"}[r.verified],
        ]
        for r in records
    ]
    print_table("sgl-bench moe (ms per call, median)", header, rows)
    print(
        "rel err = max |result - reference| / max |reference|, the reference computed in "
        "float64 from the same inputs"
    )
    interpreted = {r.impl for r in records if r.interpreted}
    if interpreted:
        print(interpreted_note(interpreted, "ms, GB/s and speedup"))
    for note in notes:
        print(f"note: {note}")
    fused = records[0]
    goal = "met" if (fused.speedup or 0.0) >= 1.3 else "NOT met"
    print(
        f"goal combine fused >= 1.3x unfused at {fused.shape}: {goal} ({fused.speedup or 0.0:.2f}x)"
    )
    ok = all(r.verified is not False for r in records)
    print(f"verified: {'yes' if ok else 'NO'}")
    print(f"wall time: {time.perf_counter() - started:.1f} s")
    return write_outputs(args, records, ok, lambda path: plot_moe(records, path), quick=args.quick)


def plot_moe(records: Sequence[MoERecord], path: str) -> None:
    """Milliseconds per call of every timed MoE op, one panel per op."""
    plt = pyplot()
    ops = list(dict.fromkeys(r.op for r in records))
    width = max(1, len(ops))
    fig, axes = plt.subplots(1, width, figsize=(4.4 * width, 4.2), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=False):
        mine = [r for r in records if r.op == op]
        ms = [r.seconds * 1e3 for r in mine]
        ax.bar(
            [r.impl for r in mine], ms, color=["tab:blue", "tab:orange", "tab:green"][: len(mine)]
        )
        for i, value in enumerate(ms):
            ax.annotate(f"{value:.2f} ms", (i, value), ha="center", va="bottom")
        ax.set_title(f"{op}\n{mine[0].shape} {mine[0].dtype}", fontsize=9)
        ax.set_ylabel("ms per call (lower is better)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("sgl-bench moe")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
