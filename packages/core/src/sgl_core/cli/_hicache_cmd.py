"""The ``hicache`` subcommand: parse, check and plan (``_hicache_plan``), run, report.

``--background-load N`` measures a second time beside N busy processes: each
a Python loop that spins one core, as a serving host's other processes do
(scheduler, tokenizer, other ranks). They are bounded three ways: the context
manager kills them on exit (also on Ctrl-C and errors), each exits by itself
after ``max_s`` seconds, and each exits when its parent is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import torch

from sgl_core.cli import _hicache_table as table
from sgl_core.cli._checks import EXIT_STATUS, CliParser
from sgl_core.cli._hicache import run_case
from sgl_core.cli._hicache_plan import MODELS, plan_run
from sgl_core.cli._report import Progress, Record, print_table, write_outputs
from sgl_core.kv._enums import HostLayout
from sgl_core.transfer.copy._calibrate import copy_calibration, default_calibrator
from sgl_core.transfer.copy._stream import stream_copy_status
from sgl_core.transfer.copy._stream_team import team_calls

__all__ = ["BUSY_CODE", "add_parser", "busy_processes", "run"]


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


def add_parser(sub: argparse._SubParsersAction[CliParser]) -> None:
    p = sub.add_parser(
        "hicache",
        help="host KV-cache backup/load bandwidth vs a contiguous copy and baselines",
        description=(
            "Back up (device->host, all layers, one call) and load (host->device, one call per "
            "layer) a batch of random device pages on a DeepSeek-V3-shaped MLA pool (61 layers, "
            "512+64 bf16), verify the round trip bit for bit, and compare GB/s with one "
            "contiguous copy of the same bytes (this machine's limit) and with plain per-token / "
            "per-page baselines. Without options: the default backend, page size 64, 2048 "
            "tokens per call, one quick pass."
        ),
        epilog=EXIT_STATUS,
    )
    p.add_argument("--backend", help="backend name(s), comma-separated, or 'all'")
    p.add_argument(
        "--model",
        choices=sorted(MODELS),
        default="deepseek-v3",
        help="KV cache shape: deepseek-v3 (MLA, 512+64 bf16, the default), deepseek-v32 "
        "(656-byte uint8 FP8 rows plus the indexer cache: 128 fp8 bytes + an fp32 scale per "
        "token, every layer), llama3-70b (MHA, 80 layers x 8 KV heads x 128, bf16), "
        "qwen3-235b (MHA, 94 layers x 4 KV heads x 128, bf16)",
    )
    p.add_argument("--layout", type=_layouts, help="host layout(s), comma-separated")
    p.add_argument("--page-size", type=_int_list, help="page sizes, e.g. 1,16,64,128")
    p.add_argument(
        "--pages",
        type=int,
        help="pages per call (default: 2048 tokens' worth with --quick and in the default "
        "run, else 4096 with --full)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        action="store_true",
        help="the default, also with --backend/--layout/--page-size: 2048 tokens, 3 repeats",
    )
    mode.add_argument(
        "--full",
        action="store_true",
        help="all backends, page sizes 1,16,64,128, 4096 tokens, 5 repeats (unless given)",
    )
    p.add_argument("--json", metavar="PATH", help="write {machine, records} as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of GB/s by page size")
    p.add_argument("--no-baselines", action="store_true", help="skip per_token/per_page")
    p.add_argument("--shuffle-host", action="store_true", help="random host pages, not alloc()")
    p.add_argument("--device", help="torch device of the device pool (default: backend's)")
    p.add_argument("--repeats", type=int, help="timed repeats (default: 3 quick, 5 full)")
    p.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="measure twice: quiet, then beside N busy processes (each spins one core; "
        "stopped at the end, also on Ctrl-C or an error)",
    )
    p.add_argument(
        "--compare-fixed",
        action="store_true",
        help="also time each transfer with the old fixed copy tuning (copy_threads 0: ATen's "
        "threads), interleaved with the calibrated one: columns fixed GB/s and sgl/fixed",
    )
    # test and tuning knobs
    for flag in ("--layers", "--tokens", "--warmup"):
        p.add_argument(flag, type=int, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    p.add_argument("--kv-lora-rank", type=int, default=512, help=argparse.SUPPRESS)
    p.add_argument("--rope-dim", type=int, default=64, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def _load() -> float:
    """The machine's 1-minute load average (0.0 where the OS does not report one)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


BUSY_CODE = """
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
parent = int(sys.argv[2])
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(20000):
        pass
"""


@contextlib.contextmanager
def busy_processes(count: int, max_s: float = 3600.0) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``with busy_processes(n) as procs:`` runs ``n`` bounded busy processes for the block.

    Every process started is killed and reaped on exit, also when starting one fails.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", BUSY_CODE, str(max_s), str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C reaches us; we stop them
                )
            )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait()


def run(args: argparse.Namespace) -> int:
    plan = plan_run(args)  # every argument is checked here, before any work
    for note in plan.notes:
        print(f"note: {note}")
    cfg, shape = plan.cfg, plan.cfg.shape
    dtype = str(shape.dtype).removeprefix("torch.")
    if shape.is_mha:
        row = f"K+V {shape.head_num} heads x {shape.head_dim} {dtype}"
    elif shape.kv_cache_dim is None:
        row = f"({cfg.kv_lora_rank}+{cfg.qk_rope_head_dim}) {dtype}"
    else:
        row = f"{shape.kv_cache_dim} packed {dtype}"
    if shape.index_head_dim is not None:
        scale = " + fp32 scale" if shape.with_index_k_scale else ""
        row += f" + indexer {shape.index_head_dim} {dtype}{scale}"
    backends = ", ".join(sorted({c.backend.name for c in plan.cases}))
    pairs = len({(c.backend.name, c.layout, c.io_backend) for c in plan.cases})
    sizes = ",".join(str(p) for p in plan.page_sizes)
    print(
        f"sgl-bench hicache: {len(plan.cases)} case(s) = backend {backends} x {pairs} "
        f"layout/io x page {sizes}; rows: backup, load\n"
        f"model {cfg.model}: {cfg.layers} layers x {row}; "
        f"{'quick' if plan.quick else 'full'}: {cfg.repeats} round(s) + {cfg.warmup} "
        f"warm-up; torch threads {torch.get_num_threads()}\n"
        f"streaming copy (CPU loads and backups): {stream_copy_status()}"
    )
    load_start = _load()
    started = time.perf_counter()
    busy = args.background_load
    phases = [("quiet", 0)] + ([(f"loaded ({busy} busy process(es))", busy)] if busy else [])
    records: list[Record] = []
    skipped: dict[str, dict[str, dict[str, object]]] = {}  # phase -> key -> ran, calls
    teamed: dict[str, dict[str, int]] = {}  # phase -> way -> calls (the streaming team)
    for phase, count in phases:
        before, team_before = default_calibrator().skipped(), team_calls()
        phase_load = _load()
        name = phase.split()[0]
        progress = Progress(len(plan.cases) * (cfg.warmup + cfg.repeats), f"hicache {name}")
        got: list[Record] = []
        with busy_processes(count):
            try:
                for case in plan.cases:
                    progress.describe(f"{name}: {case.label}")
                    for r in run_case(case, cfg, progress):
                        r.extra["phase"] = name
                        if case.backend.name in plan.interpreted:
                            r.extra["interpreted"] = True
                        got.append(r)
            finally:
                progress.close()
        records.extend(got)
        fitted = copy_calibration()
        header, rows = table.summarize(got, plan.interpreted)
        ios = {r.io_backend for r in got}  # just one: named in the title, its column dropped
        io = f"; io {ios.pop()}" if len(ios) == 1 else ""
        title = f"{phase}: host pool transfers, GB/s{io}; load {phase_load:.2f}"
        print_table(f"{title} to {_load():.2f}", header, rows)
        calibration = [f"  copy calibration: {c.key}: {c.source}, {c.reason}" for c in fitted]
        if not calibration:
            calibration = ["  copy calibration: nothing measured (no CPU copy of 1 MiB or more)"]
        calls = {
            key: (ran, n - before.get(key, (ran, 0))[1])
            for key, (ran, n) in default_calibrator().skipped().items()
        }
        skipped[name] = {k: {"ran": r, "calls": n} for k, (r, n) in calls.items() if n}
        calibration += [
            f"  copy calibration: {key}: ATen's team had no free core on {v['calls']} "
            f"call(s), which ran {v['ran']}"
            for key, v in skipped[name].items()
        ]
        teamed[name] = {k: n - team_before[k] for k, n in team_calls().items()}
        if any(teamed[name].values()):
            t = teamed[name]
            calibration.append(
                f"  streaming team: {t['team']} call(s) on the team, {t['busy']} on one thread "
                f"(cores busy); over the pool: {t['led']} (another thread led), {t['none']} "
                "(no team)"
            )
        print("\n".join([*calibration, *table.target_lines(got, plan.interpreted)]))
    print("\n".join([*table.batch_lines(records), *table.legend(records, plan.interpreted)]))
    exact = all(r.bit_exact is not False for r in records)
    print(f"bit-exact: {'yes' if exact else 'NO (exit status 1)'}")
    load_end, cpus = _load(), os.cpu_count() or 1
    print(
        f"wall time: {time.perf_counter() - started:.1f} s; machine load (1-minute average) "
        f"{load_start:.2f} at start, {load_end:.2f} at end, {cpus} CPU(s)"
    )
    if max(load_start, load_end) > cpus:
        print(
            f"warning: the machine was busy (load above its {cpus} CPU(s)): other processes "
            "shared the CPUs, so GB/s and ratios of this run are not reliable; rerun when idle"
        )
    quiet = [r for r in records if r.extra.get("phase") == "quiet"]
    return write_outputs(
        args,
        records,
        exact,
        lambda path: table.plot_hicache(quiet, path),
        command="hicache",
        quick=plan.quick,
        background_load=busy,
        copy_calibration=[dataclasses.asdict(c) for c in fitted],
        copy_team_skipped=skipped,
        stream_team=teamed,
        stream_copy=stream_copy_status(),
    )
