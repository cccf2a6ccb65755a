"""``sgl-bench hicache``: host-pool backup/load bandwidth vs the copy limit and baselines.

The baselines (:func:`per_token`, :func:`per_page`) are transfers written the plain way; both
run on any pool pair through the host pool's ``layer_views``: per layer,
``(device_rows, host_pages)`` per component.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections.abc import Callable
from typing import Any

import torch

from sgl_core.cli._hicache_plan import Case, HicacheConfig, create_device_pool
from sgl_core.cli._report import Progress, Record, median, time_interleaved
from sgl_core.kv._memory import cpu_zeros, page_aligned_zeros
from sgl_core.kv.protocols._kv_protocols import MLADevicePool, MLAHostPool
from sgl_core.kv.protocols._protocols import LayerViews
from sgl_core.transfer.copy._calibrate import default_calibrator
from sgl_core.transfer.copy._tuning import tuning_for

__all__ = ["BASELINES", "Case", "HicacheConfig", "Transfer", "per_page", "per_token", "run_case"]

DIRECTIONS = ("backup", "load")
#: at most this many untimed backup-and-load rounds while a copy calibration is confirmed
SETTLE_ROUNDS = 24
Component = tuple[torch.Tensor, torch.Tensor]


class Transfer:
    """One batch: paired host/device token indices of whole pages."""

    def __init__(
        self,
        dev: MLADevicePool,
        host: MLAHostPool,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
    ) -> None:
        self.dev = dev
        self.host = host
        self.device_indices = device_indices
        ps = host.page_size
        self.host_page = host_indices // ps
        self.host_offset = host_indices % ps
        if not isinstance(host, LayerViews):
            raise TypeError(f"{type(host).__name__} shows no layer views (layer_views)")
        self.layers: list[list[Component]] = [
            host.layer_views(dev, layer) for layer in range(dev.layer_num)
        ]
        self.page_pairs = list(
            zip(host_indices[::ps].tolist(), device_indices[::ps].tolist(), strict=True)
        )


def per_token(t: Transfer, *, to_host: bool, layer: int | None = None) -> None:
    """Per layer: gather the tokens with ``index_select``, scatter them one row each."""
    d_idx = t.device_indices.to(t.dev.device)
    layers = range(len(t.layers)) if layer is None else [layer]
    for lay in layers:
        for rows, pages in t.layers[lay]:
            if to_host:
                pages.index_put_((t.host_page, t.host_offset), rows.index_select(0, d_idx).cpu())
            else:
                rows.index_copy_(0, d_idx, pages[t.host_page, t.host_offset].to(rows.device))


def per_page(t: Transfer, *, to_host: bool, layer: int | None = None) -> None:
    """Per layer and page: one slice copy (a Python loop, like the upstream ``direct`` path)."""
    ps = t.host.page_size
    layers = range(len(t.layers)) if layer is None else [layer]
    for lay in layers:
        for rows, pages in t.layers[lay]:
            for h, d in t.page_pairs:
                if to_host:
                    pages[h // ps].copy_(rows[d : d + ps])
                else:
                    rows[d : d + ps].copy_(pages[h // ps])


BASELINES: dict[str, Callable[..., None]] = {"per_token": per_token, "per_page": per_page}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # compare bit patterns: random fill holds NaN patterns, and equal() on them is False
    return bool(torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16)))


class _Bench:
    """Pools, indices and op closures of one case."""

    def __init__(self, case: Case, cfg: HicacheConfig) -> None:
        ps = case.page_size
        n = cfg.batch_tokens(ps)
        self.case = case
        self.tokens = n
        self.dev = create_device_pool(case.backend, cfg, size=2 * n, page_size=ps)
        pool: dict[str, Any] = {"layout": case.layout, "io_backend": case.io_backend}
        self.host: Any = case.backend.create_host_pool(self.dev, host_to_device_ratio=2.0, **pool)
        self.fixed: Any = None
        if cfg.compare_fixed:
            # the same pool built with the old preset: copy_threads 0 (ATen's own threads)
            fixed = dataclasses.replace(tuning_for(self.dev.device), copy_threads=0)
            backend = type(case.backend)(tuning=fixed)  # type: ignore[call-arg]
            self.fixed = backend.create_host_pool(self.dev, host_to_device_ratio=2.0, **pool)
        gen = torch.Generator().manual_seed(cfg.seed + ps)
        # device pages 1..2n/ps (page 0 is the padding page): half backed up, half loaded into
        pages = torch.randperm(2 * n // ps, generator=gen) + 1
        offsets = torch.arange(ps)
        device = self.dev.device
        self.d_src = (pages[: n // ps, None] * ps + offsets).flatten().to(device)
        self.d_dst = (pages[n // ps :, None] * ps + offsets).flatten().to(device)
        if cfg.shuffle_host:
            host_pages = torch.randperm(self.host.size // ps, generator=gen)[: n // ps]
            self.h_idx = (host_pages[:, None] * ps + offsets).flatten()
        else:
            got = self.host.alloc(n)
            assert got is not None
            self.h_idx = got
        self.backup_t = Transfer(self.dev, self.host, self.h_idx, self.d_src)
        self.load_t = Transfer(self.dev, self.host, self.h_idx, self.d_dst)
        if self.fixed is not None:
            self.fixed_t = Transfer(self.dev, self.fixed, self.h_idx, self.d_src)
        fill = torch.Generator(device=device).manual_seed(cfg.seed)
        for comps in self.backup_t.layers:
            for rows, _ in comps:
                rows.view(torch.int16).random_(0, 1 << 15, generator=fill)
        self.nbytes = n * sum(
            rows.shape[1] * rows.element_size()
            for comps in self.backup_t.layers
            for rows, _ in comps
        )
        # the copy limit: one touched contiguous buffer of the same bytes on each side,
        # allocated as the pools are (huge pages asked for on the CPU: the ratio is the path's)
        pin = bool(getattr(self.host, "pin_memory", False))
        self.copy_host = page_aligned_zeros((self.nbytes,), torch.uint8, pin_memory=pin)
        self.copy_dev = cpu_zeros((self.nbytes,), torch.uint8, device)

    # ------------------------------------------------------------------ ops
    def sgl_backup(self, host: Any = None) -> None:
        """All layers in one call, into ``host`` (default: the calibrated pool)."""
        (host or self.host).backup_from_device_all_layer(
            self.dev, self.h_idx, self.d_src, self.case.io_backend
        )

    def sgl_load(self, host: Any = None) -> None:
        """One call per layer, from ``host`` (default: the calibrated pool)."""
        for layer in range(self.dev.layer_num):
            (host or self.host).load_to_device_per_layer(
                self.dev, self.h_idx, self.d_dst, layer, self.case.io_backend
            )

    def ops(
        self, baselines: tuple[str, ...], copy_threads: tuple[int, ...]
    ) -> dict[tuple[str, str], Callable[[], object]]:
        ops: dict[tuple[str, str], Callable[[], object]] = {}
        for direction, (dst, src), sgl in (
            ("backup", (self.copy_host, self.copy_dev), self.sgl_backup),
            ("load", (self.copy_dev, self.copy_host), self.sgl_load),
        ):
            copy = functools.partial(dst.copy_, src, non_blocking=True)
            # the reference copy at each torch thread count, most threads first: an OpenMP
            # team's threads spin for a while after it, so the op right after a multi-thread
            # copy shares the cores with them; after the 1-thread copy sgl and fixed do not
            for n in sorted(copy_threads, reverse=True):
                ops[(f"copy@{n}", direction)] = copy
            ops[("sgl", direction)] = sgl
            if self.fixed is not None:
                ops[("fixed", direction)] = functools.partial(sgl, self.fixed)
        for name in baselines:
            fn = BASELINES[name]
            ops[(name, "backup")] = functools.partial(fn, self.backup_t, to_host=True)
            ops[(name, "load")] = functools.partial(fn, self.load_t, to_host=False)
        return ops

    # --------------------------------------------------------- verification
    def verify(
        self, backup: Callable[[], object], load: Callable[[], object], t: Transfer
    ) -> tuple[bool, bool]:
        """Round trip through ``backup`` then ``load`` with ``t``'s host pool.

        Returns (host bit-exact, device bit-exact); the targets are zeroed first.
        """
        for comps in t.layers:
            for rows, pages in comps:
                pages[t.host_page, t.host_offset] = 0
                rows.index_fill_(0, self.d_dst, 0)
        backup()
        host_ok = all(
            _same_bits(pages[t.host_page, t.host_offset].to(rows.device), rows[self.d_src])
            for comps in t.layers
            for rows, pages in comps
        )
        load()
        dev_ok = all(
            _same_bits(rows[self.d_dst], rows[self.d_src])
            for comps in t.layers
            for rows, _ in comps
        )
        return host_ok, dev_ok


def _each(calls: list[Callable[[], object]]) -> None:
    for call in calls:
        call()


def settle_calibration(run_round: Callable[[], object], rounds: int = SETTLE_ROUNDS) -> int:
    """Run ``run_round`` (the case's ``sgl`` backup and load, untimed) while a copy
    calibration is confirmed on real calls (``Calibrator.turn``), so the timed rounds see
    the settled choices: at most ``rounds`` times, and not again after a round that
    recorded no trial call and ended no trial (a key whose path the settled choices no
    longer take stays open). The rounds run."""
    cal = default_calibrator()
    for done in range(rounds):
        before = cal.confirming()
        if not before[0]:
            return done
        run_round()
        if cal.confirming() == before:  # no call recorded, no trial ended
            return done + 1
    return rounds


def run_case(case: Case, cfg: HicacheConfig, progress: Progress) -> list[Record]:
    """Measure one (backend, layout, io, page size) case; one record per impl and direction."""
    bench = _Bench(case, cfg)
    ops = bench.ops(cfg.baselines, cfg.copy_threads)
    checks: dict[str, tuple[bool, bool]] = {}
    for impl in ("sgl", *cfg.baselines, *(["fixed"] if bench.fixed is not None else [])):
        t = bench.fixed_t if impl == "fixed" else bench.backup_t
        checks[impl] = bench.verify(ops[(impl, "backup")], ops[(impl, "load")], t)
    settle_calibration(functools.partial(_each, [ops[("sgl", d)] for d in DIRECTIONS]))
    engine_threads = torch.get_num_threads()
    # untimed before each op: the reference copies at their thread count, the rest as set
    threads = {k: int(k[0].removeprefix("copy@")) if "@" in k[0] else engine_threads for k in ops}
    prepare = {key: functools.partial(torch.set_num_threads, n) for key, n in threads.items()}
    try:
        samples = time_interleaved(
            ops,
            warmup=cfg.warmup,
            repeats=cfg.repeats,
            budget_s=cfg.budget_s,
            device=bench.dev.device,
            on_step=progress.advance,
            prepare=prepare,
        )
    finally:
        torch.set_num_threads(engine_threads)
    for direction in DIRECTIONS:  # the reference: per round, the faster thread count
        per_count = [samples.pop((f"copy@{n}", direction)) for n in cfg.copy_threads]
        samples[("copy", direction)] = [min(r) for r in zip(*per_count, strict=False)]
    copy_s = {d: median(samples[("copy", d)]) for d in DIRECTIONS}
    copy_best = {d: min(samples[("copy", d)]) for d in DIRECTIONS}
    records: list[Record] = []
    for (impl, direction), times in samples.items():
        seconds = median(times)
        host_ok, dev_ok = checks.get(impl, (True, True))
        records.append(
            Record(
                impl=impl,
                backend=case.backend.name,
                layout=case.layout.value,
                io_backend=case.io_backend.value,
                page_size=case.page_size,
                direction=direction,
                bytes=bench.nbytes,
                seconds=seconds,
                gbps=bench.nbytes / seconds / 1e9,
                copy_gbps=bench.nbytes / copy_s[direction] / 1e9,
                ratio=copy_s[direction] / seconds,
                samples=len(times),
                bit_exact=host_ok if direction == "backup" else dev_ok,
                tokens=bench.tokens,
                layers=cfg.layers,
                # best-of beside the medians: on a shared machine the fastest run is the cleanest
                extra={
                    "best_gbps": bench.nbytes / min(times) / 1e9,
                    "best_ratio": copy_best[direction] / min(times),
                    # copy and this impl are timed back to back in each round: paired ratios
                    "ratio_rounds": [
                        c / t for c, t in zip(samples[("copy", direction)], times, strict=False)
                    ],
                    "model": cfg.model,
                },
            )
        )
    del bench, ops
    gc.collect()
    return records
