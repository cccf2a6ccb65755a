"""HiCache L2 bandwidth of the cuda backend vs a pinned ``copy_`` of the same bytes.

DeepSeek-V3 shape (61 layers, 512 + 64, bf16). For each page size (16, 64, 128)
and every supported (host layout, io backend) pair, ``direct`` in each copy mode
(``batch``: one ``cudaMemcpyBatchAsync`` per call, copy engines preferred;
``batch-plain``: same, no flag; ``auto``: the path measured fastest per kind of
transfer, ``sgl_cuda._path_choice``, recorded as ``meta.copy_calibration``;
``foreach``: one async copy per piece, only at ``--foreach-pages``): back up the
same number of tokens from random device pages to random (churned) host pages,
all layers in one call, load them back per layer into other device pages, check
every byte, and time each op as ``--reps`` samples (best and median) against a
contiguous pinned ``copy_`` of the same bytes measured in the same round. Then
(``gpu_hicache_extra.py``) the per-layer load sweep over launch tunables, the
SM-budget view and the ncu target.

    python packages/cuda/benchmarks/gpu_hicache.py out.json            # H200: ~1-2 min
    TRITON_INTERPRET=1 python packages/cuda/benchmarks/gpu_hicache.py out.json \\
        --device cpu --tiny                                            # logic check on CPU

Prints tables and writes every row as JSON to the path given.
"""

# ruff: noqa: B023 - the lambdas in loops are called in the same iteration
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

import sgl_cuda
from sgl_core import HostLayout, IOBackend
from sgl_core.backend import copy_calibration
from sgl_cuda import CudaMLADevicePool, CudaMLAHostPool, _copy_engine, _path_choice

_Event: Callable[..., torch.cuda.Event] = torch.cuda.Event


@dataclass
class Shape:
    layers: int
    kv_lora_rank: int
    rope: int
    tokens: int  # moved per call
    page_sizes: list[int]
    reps: int


FULL = Shape(61, 512, 64, 16384, [64, 16, 128], 5)  # 64 first: sweep + SM budget
TINY = Shape(3, 16, 8, 32, [4, 8], 2)


@dataclass
class Row:
    page: int
    layout: str
    io: str
    mode: str
    op: str
    nbytes: int
    best_ms: float
    median_ms: float
    gbps: float  # best
    copy_gbps: float  # best pinned copy_ of the same bytes, same round
    ratio: float  # best / best copy
    ratio_median: float  # median / median copy
    exact: bool
    error: str = ""
    cpu_ms: float = 0.0  # median host time to issue one call (the op's whole Python path)


@dataclass
class Clock:
    """Per-call milliseconds of GPU work via CUDA events (perf_counter on CPU)."""

    device: torch.device
    cpu_ms: list[float] = field(default_factory=list)  # host time to issue, per call

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def sample(self, fn: Callable[[], object], calls: int = 1) -> float:
        """One sample: ``calls`` back-to-back calls, ms per call (after a sync)."""
        self.sync()
        if self.cuda:
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            self.cpu_ms.append((time.perf_counter() - t0) * 1e3 / calls)
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ms = (time.perf_counter() - t0) * 1e3 / calls
        self.cpu_ms.append(ms)
        return ms

    def time(
        self, fn: Callable[[], object], reps: int, calls: int = 1, warmup: int = 1
    ) -> list[float]:
        for _ in range(warmup):
            fn()
        self.cpu_ms = []
        return [self.sample(fn, calls) for _ in range(reps)]


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6 if ms > 0 else 0.0


def page_tokens(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    return (pages[:, None] * page_size + torch.arange(page_size)).flatten()


def host_rows_at(host: CudaMLAHostPool, layer: int, h_idx: torch.Tensor) -> torch.Tensor:
    """Rows ``(n, 1, dim)`` of one host layer at token indices, as a CPU copy."""
    rows = host.host_rows(layer)
    if rows is not None:
        return rows.index_select(0, h_idx)
    ps = host.page_size
    return host.kv_buffer[h_idx[::ps] // ps, layer].reshape(-1, 1, host.kv_cache_dim)


def zero_host_rows(host: CudaMLAHostPool, h_idx: torch.Tensor) -> None:
    ps = host.page_size
    if host.layout is HostLayout.PAGE_FIRST_DIRECT:
        host.kv_buffer[h_idx[::ps] // ps] = 0
    elif host.layout is HostLayout.PAGE_FIRST:
        host.kv_buffer[h_idx] = 0
    else:
        host.kv_buffer[:, h_idx] = 0


def backup_exact(
    dev: CudaMLADevicePool, host: CudaMLAHostPool, h_idx: torch.Tensor, d_idx: torch.Tensor
) -> bool:
    d_dev = d_idx.to(dev.device)
    return all(
        torch.equal(
            host_rows_at(host, layer, h_idx).to(dev.device).view(torch.int16),
            dev.kv_buffer[layer].index_select(0, d_dev).view(torch.int16),
        )
        for layer in range(dev.layer_num)
    )


def load_exact(
    dev: CudaMLADevicePool, d_idx: torch.Tensor, d2_idx: torch.Tensor, layers: list[int]
) -> bool:
    a, b = d_idx.to(dev.device), d2_idx.to(dev.device)
    return all(
        torch.equal(
            dev.kv_buffer[layer].index_select(0, b).view(torch.int16),
            dev.kv_buffer[layer].index_select(0, a).view(torch.int16),
        )
        for layer in layers
    )


def zero_dev_rows(dev: CudaMLADevicePool, d2_idx: torch.Tensor) -> None:
    idx = d2_idx.to(dev.device)
    for layer in dev.kv_buffer:
        layer[idx] = 0


@dataclass
class Case:
    """One page size: device pool, host pools by layout, index sets, copy baselines."""

    page: int
    dev: CudaMLADevicePool
    hosts: dict[HostLayout, CudaMLAHostPool]
    h_idx: torch.Tensor
    d_idx: torch.Tensor
    d2_idx: torch.Tensor
    all_bytes: int
    layer_bytes: int
    # op bytes -> (d2h samples, h2d samples)
    copies: dict[int, tuple[list[float], list[float]]]


def make_case(
    shape: Shape, page: int, device: torch.device, clock: Clock, gen: torch.Generator
) -> Case:
    n_pages = max(1, shape.tokens // page)
    dev_pages = 2 * n_pages + 2
    dev = sgl_cuda.backend.create_device_pool(
        size=dev_pages * page,
        page_size=page,
        dtype=torch.bfloat16,
        kv_lora_rank=shape.kv_lora_rank,
        qk_rope_head_dim=shape.rope,
        layer_num=shape.layers,
        device=device,
    )
    for layer in dev.kv_buffer:  # random bit patterns, generated on the device
        layer.view(torch.int16).random_(-(2**15), 2**15)
    hosts = {
        layout: sgl_cuda.backend.create_host_pool(dev, layout=layout, host_to_device_ratio=1.0)
        for layout in sgl_cuda.backend.supported_pairs
    }
    host_page_num = min(h.page_num for h in hosts.values())
    perm = torch.randperm(dev_pages - 1, generator=gen)[: 2 * n_pages] + 1  # page 0: padding
    host_pages = torch.randperm(host_page_num, generator=gen)[:n_pages]  # churned host pages
    d_idx, d2_idx = page_tokens(perm[:n_pages], page), page_tokens(perm[n_pages:], page)
    h_idx = page_tokens(host_pages, page)
    row = dev.kv_cache_dim * 2
    layer_bytes = d_idx.numel() * row
    all_bytes = layer_bytes * shape.layers
    copies = {}
    for nbytes in (all_bytes, layer_bytes):
        d = torch.empty(nbytes, dtype=torch.uint8, device=device)
        h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=clock.cuda)
        calls = 1 if nbytes == all_bytes else 10
        d2h = clock.time(lambda: h.copy_(d, non_blocking=True), shape.reps, calls)
        h2d = clock.time(lambda: d.copy_(h, non_blocking=True), shape.reps, calls)
        copies[nbytes] = (d2h, h2d)
    return Case(page, dev, hosts, h_idx, d_idx, d2_idx, all_bytes, layer_bytes, copies)


def direct_modes(page: int, foreach_pages: list[int]) -> list[str]:
    modes = ["batch", "batch-plain", "auto"]
    return [*modes, "foreach"] if page in foreach_pages else modes


def set_mode(mode: str) -> None:
    os.environ["SGL_CUDA_DIRECT_COPY"] = mode if mode in _path_choice.MOVER_MODES else "foreach"


def calibration_lines() -> list[str]:
    """What ``auto`` (and the CPU copy threads) chose in this run, and why."""
    choices = copy_calibration()
    if not choices:
        return ["copy calibration: nothing measured"]
    return [f"copy calibration: {c.key}: {c.choice} ({c.source}; {c.reason})" for c in choices]


def bench_pair(
    case: Case, layout: HostLayout, io: IOBackend, mode: str, shape: Shape, clock: Clock
) -> list[Row]:
    host, dev = case.hosts[layout], case.dev
    h_idx, d_idx, d2_idx = case.h_idx, case.d_idx, case.d2_idx
    set_mode(mode)
    layers = shape.layers
    slow = mode == "foreach"
    reps = 2 if slow else shape.reps

    def backup() -> None:
        host.backup_from_device_all_layer(dev, h_idx, d_idx, io)

    def load_all() -> None:
        for layer in range(layers):
            host.load_to_device_per_layer(dev, h_idx, d2_idx, layer, io)

    def load_one() -> None:
        host.load_to_device_per_layer(dev, h_idx, d2_idx, layers // 2, io)

    zero_host_rows(host, h_idx)
    backup_ms = clock.time(backup, reps, warmup=0 if slow else 1)
    cpu = {"backup_all_layers": statistics.median(clock.cpu_ms)}
    host.synchronize()
    exact_backup = backup_exact(dev, host, h_idx, d_idx)
    zero_dev_rows(dev, d2_idx)
    load_all_ms = clock.time(load_all, reps, warmup=0 if slow else 1)
    cpu["load_all_layers"] = statistics.median(clock.cpu_ms)
    clock.sync()
    exact_load = load_exact(dev, d_idx, d2_idx, list(range(layers)))
    zero_dev_rows(dev, d2_idx)
    load_one_ms = clock.time(load_one, reps, calls=2 if slow else 10)
    cpu["load_one_layer"] = statistics.median(clock.cpu_ms)
    clock.sync()
    exact_one = load_exact(dev, d_idx, d2_idx, [layers // 2])
    rows = []
    for op, nbytes, ms, exact, direction in (
        ("backup_all_layers", case.all_bytes, backup_ms, exact_backup, 0),
        ("load_all_layers", case.all_bytes, load_all_ms, exact_load, 1),
        ("load_one_layer", case.layer_bytes, load_one_ms, exact_one, 1),
    ):
        copy = case.copies[nbytes][direction]
        row = make_row(case.page, layout.value, io.value, mode, op, nbytes, ms, copy, exact)
        row.cpu_ms = cpu[op]
        rows.append(row)
    return rows


def make_row(
    page: int,
    layout: str,
    io: str,
    mode: str,
    op: str,
    nbytes: int,
    ms: list[float],
    copy: list[float],
    exact: bool,
) -> Row:
    best, med = min(ms), statistics.median(ms)
    cbest, cmed = min(copy), statistics.median(copy)
    return Row(
        page,
        layout,
        io,
        mode,
        op,
        nbytes,
        best,
        med,
        gbps(nbytes, best),
        gbps(nbytes, cbest),
        cbest / best if best > 0 else 0.0,
        cmed / med if med > 0 else 0.0,
        exact,
    )


def print_rows(rows: list[Row], header: bool = True) -> None:
    if header:
        print(
            f"{'page':>5} {'layout':<18}{'io':<7}{'mode':<12}{'op':<18}{'MB':>8}{'best ms':>9}"
            f"{'GB/s':>7}{'copy':>7}{'ratio':>7}{'r.med':>7}{'cpu ms':>8}  exact"
        )
    for r in rows:
        print(
            f"{r.page:>5} {r.layout:<18}{r.io:<7}{r.mode:<12}{r.op:<18}{r.nbytes / 1e6:>8.1f}"
            f"{r.best_ms:>9.3f}{r.gbps:>7.1f}{r.copy_gbps:>7.1f}{r.ratio:>7.2f}{r.ratio_median:>7.2f}"
            f"{r.cpu_ms:>8.3f}"
            f"  {r.exact}{' ' + r.error if r.error else ''}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("json_out", help="where to write the result rows (JSON)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (interpreter)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU logic check)")
    parser.add_argument("--pages", default=None, help="page sizes, e.g. 16,64,128")
    parser.add_argument("--tokens", type=int, default=None, help="tokens moved per call")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--foreach-pages", default="64", help="page sizes that also run foreach")
    parser.add_argument("--skip", default="", help="comma list of: main,sweep,smbudget")
    parser.add_argument("--ncu-target", action="store_true", help="only a few per-layer loads")
    parser.add_argument(
        "--budget-s", type=float, default=0.0, help="start no new page size after this many s"
    )
    parser.add_argument(
        "--summarize", action="store_true", help="print the compact summary of json_out only"
    )
    args = parser.parse_args(argv)

    import gpu_hicache_extra as extra  # the sibling module (sweep, SM budget, ncu target)

    shape = TINY if args.tiny else FULL
    if args.pages:
        shape.page_sizes = [int(p) for p in args.pages.split(",")]
    if args.tokens:
        shape.tokens = args.tokens
    if args.reps:
        shape.reps = args.reps
    device = torch.device(args.device)
    if args.ncu_target:
        extra.ncu_target(shape, device)
        return 0
    if args.summarize:
        with open(args.json_out, encoding="utf-8") as f:
            saved = json.load(f)
        extra.print_compact([Row(**r) for r in saved["rows"]], saved)
        return 0
    skip = set(filter(None, args.skip.split(",")))
    foreach_pages = [int(p) for p in args.foreach_pages.split(",") if p]
    clock = Clock(device)
    gen = torch.Generator().manual_seed(0)
    t_start = time.perf_counter()
    rows: list[Row] = []
    extras: dict[str, Any] = {}
    mid = shape.page_sizes[0]  # the sweep and SM budget run at the first page size
    meta: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if clock.cuda else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "batched_copy_available": _copy_engine.available(),
        "cuda_runtime": extra.runtime_version(),
        "shape": asdict(shape),
    }

    def dump() -> None:  # after every step: a timeout still leaves what was measured
        meta["seconds"] = time.perf_counter() - t_start
        meta["batched_copy_disabled"] = _copy_engine.disabled_reason()
        # what SGL_CUDA_DIRECT_COPY=auto picked per kind of transfer, and why
        meta["copy_calibration"] = [asdict(c) for c in copy_calibration()]
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows], **extras}, out, indent=1)

    for page in shape.page_sizes:
        t0 = time.perf_counter()
        if args.budget_s and t0 - t_start > args.budget_s:
            print(f"page {page}: skipped, {t0 - t_start:.0f}s > --budget-s", file=sys.stderr)
            meta.setdefault("skipped_pages", []).append(page)
            continue
        case = make_case(shape, page, device, clock, gen)
        print(f"page {page}: pools + copies {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        if "main" not in skip:
            for layout, ios in sgl_cuda.backend.supported_pairs.items():
                for io in sorted(ios, key=lambda m: m.value):
                    modes = direct_modes(page, foreach_pages) if io is IOBackend.DIRECT else ["-"]
                    for mode in modes:
                        t1 = time.perf_counter()
                        if mode.startswith("batch") and clock.cuda and not _copy_engine.available():
                            # It would time the per-piece path (slow) under a batch label.
                            why = _copy_engine.disabled_reason() or "no cudaMemcpyBatchAsync"
                            rows.append(
                                Row(
                                    page,
                                    layout.value,
                                    io.value,
                                    mode,
                                    "error",
                                    0,
                                    0,
                                    0,
                                    0,
                                    0,
                                    0,
                                    0,
                                    False,
                                    f"skipped: {why}",
                                )
                            )
                            continue
                        try:
                            new = bench_pair(case, layout, io, mode, shape, clock)
                            rows.extend(new)
                            print_rows(new, header=False)
                            dump()
                        except Exception:  # keep going: one failure must not hide the rest
                            err = traceback.format_exc(limit=-3)[-800:]
                            rows.append(
                                Row(
                                    page,
                                    layout.value,
                                    io.value,
                                    mode,
                                    "error",
                                    0,
                                    0,
                                    0,
                                    0,
                                    0,
                                    0,
                                    0,
                                    False,
                                    err,
                                )
                            )
                        print(
                            f"  {page} {layout.value}/{io.value}/{mode}: "
                            f"{time.perf_counter() - t1:.1f}s",
                            file=sys.stderr,
                        )
        if page == mid:
            for name, fn in (("sweep", extra.sweep), ("smbudget", extra.sm_budget)):
                if name in skip:
                    continue
                t1 = time.perf_counter()
                try:
                    extras[name] = fn(case, shape, clock)
                except Exception:
                    extras[name] = {"error": traceback.format_exc(limit=-4)[-1500:]}
                print(f"  {name}: {time.perf_counter() - t1:.1f}s", file=sys.stderr)
                dump()
        dump()
        del case
        if clock.cuda:
            torch.cuda.empty_cache()
    os.environ.pop("SGL_CUDA_DIRECT_COPY", None)

    print("=== results")
    print_rows(rows)
    extra.print_extras(extras)
    dump()
    ok = all(r.exact for r in rows) and extra.extras_exact(extras)
    extra.print_compact(rows, extras)
    for line in calibration_lines():
        print(line[:300])
    print(
        f"batched copy available at start: {meta['batched_copy_available']}, "
        f"cudart {meta['cuda_runtime']}; switched off: {_copy_engine.disabled_reason() or 'no'}"
    )
    print(
        f"{'all bit-exact' if ok else 'MISMATCH OR ERROR'}; {meta['seconds']:.1f}s; "
        f"wrote {args.json_out}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
