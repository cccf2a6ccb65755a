"""The parts of ``gpu_hicache.py`` that look for the limit (imported by it, not run alone).

* :func:`sweep`: a per-layer ``kernel`` load (and the all-layer backup) timed
  through each layer of the stack: the host pool with CPU indices (what the
  table above times), the pool with device indices (as an engine calls it),
  ``kvcacheio`` with device indices (no pool validation), and the Triton
  launch wrapper alone over a grid of tiles, warps and grid orders. Every
  variant is checked bit-exact.
* :func:`sm_budget`: a bf16 matmul loop on one stream while each io backend
  loads (or backs up) on another: the matmul's slowdown and the io's GB/s under
  contention, next to a pinned ``copy_`` doing the same.
* :func:`ncu_target`: a few per-layer loads of one layer, for ``ncu``.
"""

# ruff: noqa: B023 - the lambdas in loops are called in the same iteration
from __future__ import annotations

import statistics
from typing import Any

import torch
from gpu_hicache import (
    Case,
    Clock,
    Shape,
    backup_exact,
    gbps,
    load_exact,
    set_mode,
    zero_dev_rows,
    zero_host_rows,
)

from sgl_core import HostLayout, IOBackend
from sgl_cuda import _copy_engine, _cudart, kvcacheio
from sgl_cuda._triton import kvcacheio as tk

# (block_r, block_w, num_warps, layers_inner); None: the wrapper's default.
LOAD_TILES: list[tuple[int | None, int | None, int, bool | None]] = [
    (None, None, 4, None),  # today's default: 64 x 16, 4 warps
    (32, 16, 4, None),
    (16, 16, 4, None),
    (64, 16, 8, None),
    (32, 16, 2, None),
    (16, 16, 1, None),
    (8, 16, 1, None),
    (16, 64, 4, None),
    (8, 256, 4, None),
    (16, 256, 8, None),
]
BACKUP_TILES: list[tuple[int | None, int | None, int, bool | None]] = [
    (None, None, 4, True),
    (None, None, 4, False),
    (32, 16, 4, None),
    (16, 256, 8, None),
]


def runtime_version() -> int:
    rt = _cudart.runtime() if torch.cuda.is_available() else None
    return rt.version if rt is not None else 0


def _stats(
    nbytes: int, ms: list[float], copy: list[float], cpu: list[float] | None = None
) -> dict[str, Any]:
    best, med = min(ms), statistics.median(ms)
    return {
        "best_ms": best,
        "median_ms": med,
        "gbps": gbps(nbytes, best),
        "ratio": min(copy) / best if best > 0 else 0.0,
        "ratio_median": statistics.median(copy) / med if med > 0 else 0.0,
        "cpu_ms": statistics.median(cpu) if cpu else 0.0,
    }


def _launch_args(
    case: Case,
    layout: HostLayout,
    layer: int,
    backup: bool,
    d_dev: torch.Tensor,
    h_dev: torch.Tensor,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    host, dev = case.hosts[layout], case.dev
    words = host.shape.token_stride_size // 8
    layout_w = host.shape.layout_dim // 8
    pf = layout is HostLayout.PAGE_FIRST
    if backup:
        dst = host.kv_buffer if pf else host.data_ptrs
        return (dev.data_ptrs, dst, d_dev, h_dev), {
            "words": words,
            "layer_offset": 0,
            "num_layers": dev.layer_num,
            "src_row_w": words,
            "src_layer_w": 0,
            "dst_row_w": layout_w if pf else words,
            "dst_layer_w": words if pf else 0,
            "src_table": True,
            "dst_table": not pf,
        }
    src = host.kv_buffer if pf else host.kv_buffer[layer]
    return (src, dev.kv_buffer[layer], h_dev, d_dev), {
        "words": words,
        "layer_offset": layer if pf else 0,
        "num_layers": 1,
        "src_row_w": layout_w if pf else words,
        "src_layer_w": words if pf else 0,
        "dst_row_w": words,
        "dst_layer_w": 0,
        "src_table": False,
        "dst_table": False,
    }


def sweep(case: Case, shape: Shape, clock: Clock) -> dict[str, Any]:
    dev, layer = case.dev, shape.layers // 2
    h_cpu, d2_cpu = case.h_idx, case.d2_idx
    h_dev, d2_dev = h_cpu.to(dev.device), d2_cpu.to(dev.device)
    d_dev = case.d_idx.to(dev.device)
    copy_h2d = case.copies[case.layer_bytes][1]
    copy_d2h_all = case.copies[case.all_bytes][0]
    calls = 20 if clock.cuda else 1
    out: list[dict[str, Any]] = []
    for layout in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST):
        host = case.hosts[layout]
        # Fill the host rows once (kernel backup, checked by the main table).
        host.backup_from_device_all_layer(dev, h_cpu, case.d_idx, IOBackend.KERNEL)
        host.synchronize()
        item = host.shape.token_stride_size
        variants: list[tuple[str, Any]] = [
            (
                "pool, CPU indices",
                lambda: host.load_to_device_per_layer(dev, h_cpu, d2_cpu, layer, "kernel"),
            ),
            (
                "pool, device indices",
                lambda: host.load_to_device_per_layer(dev, h_dev, d2_dev, layer, "kernel"),
            ),
            (
                "pool, CPU indices, upload per call",
                lambda: _no_reuse(
                    host, lambda: host.load_to_device_per_layer(dev, h_cpu, d2_cpu, layer, "kernel")
                ),
            ),
            (
                "pool path before: pageable upload per call",
                lambda: _old_load(host, dev, h_cpu, d2_cpu, layer),
            ),
            (
                "index upload only (pageable)",
                lambda: (
                    h_cpu.to(dev.device, non_blocking=True),
                    d2_cpu.to(dev.device, non_blocking=True),
                ),
            ),
            (
                "index upload only (pinned)",
                lambda: (
                    _pinned(h_cpu).to(dev.device, non_blocking=True),
                    _pinned(d2_cpu).to(dev.device, non_blocking=True),
                ),
            ),
        ]
        if layout is HostLayout.LAYER_FIRST:
            variants.append(
                (
                    "kvcacheio, device indices",
                    lambda: kvcacheio.transfer_kv_per_layer_mla(
                        host.kv_buffer[layer], dev.kv_buffer[layer], h_dev, d2_dev, item
                    ),
                )
            )
        else:
            variants.append(
                (
                    "kvcacheio, device indices",
                    lambda: kvcacheio.transfer_kv_per_layer_mla_pf_lf(
                        host.kv_buffer,
                        dev.kv_buffer[layer],
                        h_dev,
                        d2_dev,
                        layer,
                        item,
                        host.shape.layout_dim,
                    ),
                )
            )
        args, kw = _launch_args(case, layout, layer, False, d2_dev, h_dev)
        for br, bw, nw, li in LOAD_TILES:
            tile = {"block_r": br, "block_w": bw, "num_warps": nw, "layers_inner": li}
            variants.append(
                (
                    _tile_name(kw["words"], br, bw, nw),
                    lambda t=tile: tk.launch_copy_rows(*args, **kw, **t),
                )
            )
        for name, fn in variants:
            zero_dev_rows(dev, d2_cpu)
            ms = clock.time(fn, shape.reps, calls=calls)
            clock.sync()
            exact = name.startswith("index upload") or load_exact(dev, case.d_idx, d2_cpu, [layer])
            out.append(
                {
                    "layout": layout.value,
                    "op": "load_one_layer",
                    "variant": name,
                    "exact": exact,
                    **_stats(case.layer_bytes, ms, copy_h2d, clock.cpu_ms),
                }
            )
        bargs, bkw = _launch_args(case, layout, 0, True, d_dev, h_dev)
        for br, bw, nw, li in BACKUP_TILES:
            tile = {"block_r": br, "block_w": bw, "num_warps": nw, "layers_inner": li}
            zero_host_rows(host, h_cpu)
            ms = clock.time(lambda t=tile: tk.launch_copy_rows(*bargs, **bkw, **t), shape.reps)
            clock.sync()
            exact = backup_exact(dev, host, h_cpu, case.d_idx)
            out.append(
                {
                    "layout": layout.value,
                    "op": "backup_all_layers",
                    "variant": f"{_tile_name(bkw['words'], br, bw, nw)} inner={li}",
                    "exact": exact,
                    **_stats(case.all_bytes, ms, copy_d2h_all, clock.cpu_ms),
                }
            )
    out.extend(_direct_variants(case, shape, clock, layer, calls))
    return {"page": case.page, "rows": out}


def _tile_name(words: int, br: int | None, bw: int | None, nw: int) -> str:
    default_r, default_w, _ = tk.tile_for(words)
    r, w = br or default_r, bw or default_w
    flag = " (default)" if (r, w, nw) == (default_r, default_w, 4) else ""
    return f"launch {r}x{w} w{nw}{flag}"


def _old_load(host: Any, dev: Any, h_cpu: torch.Tensor, d_cpu: torch.Tensor, layer: int) -> None:
    """The pool's per-layer kernel load as it was: pageable index uploads on every call."""
    device = dev.device
    h_idx = h_cpu.to(device, non_blocking=True)
    d_idx = d_cpu.to(device, non_blocking=True)
    item = host.shape.token_stride_size
    if host.layout is HostLayout.LAYER_FIRST:
        kvcacheio.transfer_kv_per_layer_mla(
            host.kv_buffer[layer], dev.kv_buffer[layer], h_idx, d_idx, item
        )
    else:
        kvcacheio.transfer_kv_per_layer_mla_pf_lf(
            host.kv_buffer, dev.kv_buffer[layer], h_idx, d_idx, layer, item, host.shape.layout_dim
        )


def _pinned(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if torch.cuda.is_available() else t


def _no_reuse(host: Any, fn: Any) -> None:
    host.reuse_index_uploads = False
    try:
        fn()
    finally:
        host.reuse_index_uploads = True


def _direct_variants(
    case: Case, shape: Shape, clock: Clock, layer: int, calls: int
) -> list[dict[str, Any]]:
    """Per-layer direct loads through the pool per mode, and the batched copy alone."""
    dev, ps = case.dev, case.page
    h_cpu, d2_cpu = case.h_idx, case.d2_idx
    copy_h2d = case.copies[case.layer_bytes][1]
    out = []
    row = case.hosts[HostLayout.LAYER_FIRST].shape.token_stride_size
    lf = case.hosts[HostLayout.LAYER_FIRST]
    pfd = case.hosts[HostLayout.PAGE_FIRST_DIRECT]
    for host in (lf, pfd):
        host.backup_from_device_all_layer(dev, h_cpu, case.d_idx, IOBackend.DIRECT)
        host.synchronize()
    # The batched copy alone: address arrays built once, then only the runtime call.
    runs = _copy_engine.token_runs(h_cpu, d2_cpu)
    base = lambda t: torch.tensor([t.data_ptr()], dtype=torch.int64)  # noqa: E731
    lf_arrays = _copy_engine.layer_pieces(
        base(lf.data_refs[layer]), base(dev.kv_buffer[layer]), runs, row
    )
    pages = h_cpu[::ps] // ps
    es = pfd.kv_buffer.element_size()
    addr = pfd.kv_buffer.data_ptr() + pages[:, None] * (pfd.kv_buffer.stride(0) * es)
    addr = addr + layer * pfd.kv_buffer.stride(1) * es
    pfd_arrays = _copy_engine.page_pieces(
        addr, base(dev.kv_buffer[layer]), d2_cpu[::ps], row, row * ps
    )
    variants: list[tuple[str, str, Any]] = []
    for name, host in (("layer_first", lf), ("page_first_direct", pfd)):
        for mode in ("batch", "batch-plain", "foreach"):
            variants.append(
                (
                    name,
                    f"pool direct {mode}",
                    (
                        mode,
                        lambda h=host: h.load_to_device_per_layer(
                            dev, h_cpu, d2_cpu, layer, "direct"
                        ),
                    ),
                )
            )
        if _copy_engine.available():
            arrays = lf_arrays if host is lf else pfd_arrays
            for mode in ("batch", "batch-plain"):
                variants.append(
                    (
                        name,
                        f"batch call only ({mode})",
                        (
                            mode,
                            lambda a=arrays, m=mode: _copy_engine._issue(
                                a, dev.device, m, (False, True)
                            ),
                        ),
                    )
                )
    for layout, name, (mode, fn) in variants:
        set_mode(mode)
        zero_dev_rows(dev, d2_cpu)
        slow = mode == "foreach"
        ms = clock.time(fn, 2 if slow else shape.reps, calls=2 if slow else calls)
        clock.sync()
        exact = load_exact(dev, case.d_idx, d2_cpu, [layer])
        out.append(
            {
                "layout": layout,
                "op": "load_one_layer",
                "variant": name,
                "exact": exact,
                **_stats(case.layer_bytes, ms, copy_h2d, clock.cpu_ms),
            }
        )
    set_mode("batch")
    return out


def sm_budget(case: Case, shape: Shape, clock: Clock) -> dict[str, Any]:
    """Matmul slowdown and io GB/s when both run at once on two streams."""
    dev, layers = case.dev, shape.layers
    n = 8192 if clock.cuda else 64
    a = torch.randn(n, n, device=dev.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev.device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev.device, dtype=torch.bfloat16)
    gemm_flop = 2 * n**3
    one = clock.time(lambda: torch.mm(a, b, out=c), 3, calls=5 if clock.cuda else 1)
    gemm_ms = statistics.median(one)
    window_ms = 80.0 if clock.cuda else 1.0
    n_gemm = max(1, int(window_ms / gemm_ms))
    h_cpu, d2_cpu = case.h_idx, case.d2_idx
    dh = torch.empty(case.layer_bytes, dtype=torch.uint8, device=dev.device)
    hh = torch.empty(case.layer_bytes, dtype=torch.uint8, pin_memory=clock.cuda)
    units: list[tuple[str, str, Any]] = [
        ("copy_ h2d (copy engine)", "-", lambda i: dh.copy_(hh, non_blocking=True))
    ]
    for layout, mode in ((HostLayout.LAYER_FIRST, "-"), (HostLayout.PAGE_FIRST, "-")):
        host = case.hosts[layout]
        units.append(
            (
                f"{layout.value}/kernel load",
                mode,
                lambda i, h=host: h.load_to_device_per_layer(
                    dev, h_cpu, d2_cpu, i % layers, "kernel"
                ),
            )
        )
    for layout in (HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST_DIRECT):
        host = case.hosts[layout]
        for mode in ("foreach", "batch", "batch-plain"):
            units.append(
                (
                    f"{layout.value}/direct load",
                    mode,
                    lambda i, h=host: h.load_to_device_per_layer(
                        dev, h_cpu, d2_cpu, i % layers, "direct"
                    ),
                )
            )
    host_lf = case.hosts[HostLayout.LAYER_FIRST]
    for mode in ("-", "batch"):
        io = "kernel" if mode == "-" else "direct"
        units.append(
            (
                f"layer_first/{io} backup",
                mode,
                lambda i, io=io: host_lf.backup_from_device_all_layer(dev, h_cpu, case.d_idx, io),
            )
        )
    rows = []
    mm_alone = _gemm_window(a, b, c, n_gemm, clock)
    for name, mode, unit in units:
        set_mode(mode)
        nbytes = case.all_bytes if "backup" in name else case.layer_bytes
        unit(0)  # warm-up
        alone = clock.time(lambda: unit(1), 2, calls=1, warmup=0)
        unit_ms = statistics.median(alone)
        count = max(2, int(1.3 * mm_alone / unit_ms) + 1) if clock.cuda else 2
        count = min(count, 400)
        mm_ms, io_rates = _contended(a, b, c, n_gemm, unit, count, nbytes, clock)
        rows.append(
            {
                "io": name,
                "mode": mode,
                "io_alone_gbps": gbps(nbytes, unit_ms),
                "io_contended_gbps": statistics.median(io_rates) if io_rates else 0.0,
                "io_units_inside_window": len(io_rates),
                "matmul_alone_ms": mm_alone,
                "matmul_with_io_ms": mm_ms,
                "matmul_slowdown": mm_ms / mm_alone if mm_alone > 0 else 0.0,
            }
        )
    set_mode("batch")
    return {"gemm_n": n, "gemm_tflops": gemm_flop / gemm_ms / 1e9, "n_gemm": n_gemm, "rows": rows}


def _gemm_window(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, n_gemm: int, clock: Clock
) -> float:
    return min(
        clock.sample(lambda: [torch.mm(a, b, out=c) for _ in range(n_gemm)]) for _ in range(2)
    )


def _contended(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    n_gemm: int,
    unit: Any,
    count: int,
    nbytes: int,
    clock: Clock,
) -> tuple[float, list[float]]:
    """Matmul ms with the io running beside it, and the GB/s of io units inside the window."""
    if not clock.cuda:
        mm = clock.sample(lambda: [torch.mm(a, b, out=c) for _ in range(n_gemm)])
        io = [gbps(nbytes, clock.sample(lambda: unit(0)))]
        return mm, io
    clock.sync()
    mm_stream, io_stream = torch.cuda.Stream(), torch.cuda.Stream()
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    start = ev()
    start.record()
    mm_stream.wait_event(start)
    io_stream.wait_event(start)
    mm_end = ev()
    with torch.cuda.stream(mm_stream):
        for _ in range(n_gemm):
            torch.mm(a, b, out=c)
        mm_end.record()
    marks = []
    with torch.cuda.stream(io_stream):
        for i in range(count):
            unit(i)
            e = ev()
            e.record()
            marks.append(e)
    torch.cuda.synchronize()
    mm_ms = start.elapsed_time(mm_end)
    t = [start.elapsed_time(e) for e in marks]
    rates = []
    prev = 0.0
    for end in t:
        if end <= mm_ms and end > prev:
            rates.append(gbps(nbytes, end - prev))
        prev = end
    return mm_ms, rates


def ncu_target(shape: Shape, device: torch.device) -> None:
    """Warm-up launch, then one per-layer load of each kernel layout (2 launches to profile)."""
    tokens, dim = shape.tokens, shape.kv_lora_rank + shape.rope
    gen = torch.Generator().manual_seed(0)
    pinned = device.type == "cuda"
    host_lf = torch.zeros(2 * tokens, 1, dim, dtype=torch.bfloat16, pin_memory=pinned)
    host_pf = torch.zeros(2 * tokens, 4, 1, dim, dtype=torch.bfloat16, pin_memory=pinned)
    dst = torch.zeros(2 * tokens, 1, dim, dtype=torch.bfloat16, device=device)
    ps = 64 if tokens >= 64 else 4
    pages = torch.randperm(2 * tokens // ps, generator=gen)[: tokens // ps]
    h = (pages[:, None] * ps + torch.arange(ps)).flatten().to(device)
    d = torch.arange(tokens, device=device)
    item = dim * 2
    kvcacheio.transfer_kv_per_layer_mla(host_lf, dst, h, d, item)  # compile / warm-up
    kvcacheio.transfer_kv_per_layer_mla(host_lf, dst, h, d, item)
    kvcacheio.transfer_kv_per_layer_mla_pf_lf(host_pf, dst, h, d, 2, item, 4 * item)
    if pinned:
        torch.cuda.synchronize()
    print("ncu target: 3 launches of _copy_rows_kernel (skip 1)")


def extras_exact(extras: dict[str, Any]) -> bool:
    sw = extras.get("sweep", {})
    if "error" in sw or "error" in extras.get("smbudget", {}):
        return False
    return all(r["exact"] for r in sw.get("rows", []))


def print_extras(extras: dict[str, Any]) -> None:
    sw = extras.get("sweep", {})
    if "error" in sw:
        print(f"sweep ERROR: {sw['error']}")
    if sw.get("rows"):
        print("\nsweep (page mid; ratio = best vs best pinned copy_ of the same bytes)")
        print(
            f"{'layout':<18}{'op':<18}{'variant':<36}{'best ms':>9}{'GB/s':>7}{'ratio':>7}"
            f"{'r.med':>7}{'cpu ms':>8} exact"
        )
        for r in sw["rows"]:
            print(
                f"{r['layout']:<18}{r['op']:<18}{r['variant']:<36}{r['best_ms']:>9.3f}"
                f"{r['gbps']:>7.1f}{r['ratio']:>7.2f}{r['ratio_median']:>7.2f}{r['cpu_ms']:>8.3f}"
                f" {r['exact']}"
            )
    sm = extras.get("smbudget", {})
    if "error" in sm:
        print(f"smbudget ERROR: {sm['error']}")
    if sm.get("rows"):
        print(
            f"\nSM budget: {sm['n_gemm']} bf16 GEMMs {sm['gemm_n']}^2 "
            f"({sm['gemm_tflops']:.0f} TFLOP/s alone) beside each io"
        )
        print(
            f"{'io':<34}{'mode':<12}{'alone GB/s':>11}{'contended':>10}{'units':>6}"
            f"{'mm slowdown':>12}"
        )
        for r in sm["rows"]:
            print(
                f"{r['io']:<34}{r['mode']:<12}{r['io_alone_gbps']:>11.1f}{r['io_contended_gbps']:>10.1f}{r['io_units_inside_window']:>6}{r['matmul_slowdown']:>12.3f}"
            )


def print_compact(rows: list[Any], extras: dict[str, Any]) -> None:
    """The few lines to read first (the GPU check prints only these)."""
    print("=== compact: ratio to a pinned copy_ of the same bytes, best/median")
    by_key: dict[tuple[int, str], dict[str, Any]] = {}
    for r in rows:
        by_key.setdefault((r.page, f"{r.layout}/{r.io}/{r.mode}"), {})[r.op] = r
    for (page, key), ops in by_key.items():
        cells = []
        for op, label in (
            ("backup_all_layers", "backup"),
            ("load_all_layers", "load_all"),
            ("load_one_layer", "load_one"),
        ):
            r = ops.get(op)
            cells.append(f"{label} {r.ratio:.2f}/{r.ratio_median:.2f}" if r else f"{label} -")
        err = ops.get("error")
        exact = all(r.exact for r in ops.values())
        tail = (
            f" ERROR {err.error.splitlines()[-1][:80]}" if err else ("" if exact else " MISMATCH")
        )
        print(f"{page:>4} {key:<37}" + "  ".join(cells) + tail)
    sw = extras.get("sweep", {})
    if "error" in sw:
        print("sweep ERROR", sw["error"].splitlines()[-1][:200])
    srows = sw.get("rows", [])
    keep = []
    for layout in ("layer_first", "page_first"):
        loads = [r for r in srows if r["layout"] == layout and r["op"] == "load_one_layer"]
        tiles = sorted(
            (r for r in loads if r["variant"].startswith("launch ")), key=lambda r: r["best_ms"]
        )
        lead = ("pool,", "pool path", "index upload only (pageable)", "kvcacheio")
        keep += [r for r in loads if r["variant"].startswith(lead)]
        default = [r for r in tiles if r["variant"].endswith("(default)")]
        keep += default + [r for r in tiles[:3] if r not in default]
        backups = [r for r in srows if r["layout"] == layout and r["op"] == "backup_all_layers"]
        best = sorted(backups, key=lambda r: r["best_ms"])[:1]
        keep += [r for r in backups if "(default)" in r["variant"]] + [
            r for r in best if "(default)" not in r["variant"]
        ]
    keep += [r for r in srows if r["variant"].startswith(("pool direct", "batch call"))]
    if keep:
        print(
            f"sweep (page {sw.get('page', '?')}): ratio best/median, GPU ms per call, "
            "CPU ms to issue"
        )
    for r in keep:
        print(
            f" {r['layout'][:11]:<12}{r['op'].split('_')[0]:<7}{r['variant'][:40]:<41}"
            f"{r['ratio']:.2f}/{r['ratio_median']:.2f} {r['best_ms']:.3f} cpu {r['cpu_ms']:.3f}"
            f"{'' if r['exact'] else ' MISMATCH'}"
        )
    sm = extras.get("smbudget", {})
    if "error" in sm:
        print("smbudget ERROR", sm["error"].splitlines()[-1][:200])
    if sm.get("rows"):
        print(
            "SM budget: matmul slowdown beside each io; io GB/s alone -> contended "
            f"({sm['gemm_tflops']:.0f} TFLOP/s alone)"
        )
        for r in sm["rows"]:
            print(
                f"  {r['io']:<32}{r['mode']:<12}x{r['matmul_slowdown']:.3f}  "
                f"{r['io_alone_gbps']:.1f} -> {r['io_contended_gbps']:.1f} GB/s "
                f"({r['io_units_inside_window']})"
            )
