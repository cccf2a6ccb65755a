"""A/B of the busy-core check (``sgl_core.transfer.copy._busy``) beside busy processes.

Per case, on one pool: the backups calibrate on a quiet machine (what an engine
that started idle has), the calibrator's choices are kept, then ``--busy`` busy
processes start and every round runs, interleaved, the reference copy (the
faster of a 1- and an N-thread contiguous copy of the same bytes) and one
backup each way from the *quiet* choices (restored before each call, so every
call is the first one after load arrived):

* ``check``: the code as it is (a team choice runs only with free cores);
* ``nocheck``: ``team_fits`` patched to always say yes (the code before it).

``--force-team`` sets every quiet thread choice that measured ``0`` at all to
``0`` first (what a quiet measurement picks on a machine whose team wins).
Then, without restoring, ``nocheck`` runs ``--tail`` calls in a row, as an engine
would: the stale rule's recovery. Random host pages (``--shuffle-host``)::

    PYTHONPATH=packages/core/src:packages/ascend/src \\
        python scripts/busy_core_ab.py [--busy 1] [--rounds 9] [--force-team] [--json out]
"""

from __future__ import annotations

import argparse
import copy as copymod
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import sgl_core
from sgl_core.cli import _hicache as bench
from sgl_core.cli._hicache_cmd import busy_processes
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.transfer.copy import _busy, _calibrate

CASES = [  # kind, backend, layout, io, page
    ("mla", "torch", "layer_first", "direct", 16),
    ("mla", "torch", "page_first_direct", "direct", 16),
    ("mla", "torch", "page_first", "direct", 64),
    ("mla", "torch", "layer_first", "direct", 64),
    ("mha", "torch", "page_head", "direct", 16),
    ("mla", "ascend", "page_first_kv_split", "kernel_ascend", 16),
    ("mha", "ascend", "page_first_direct", "kernel_ascend", 64),
]
MHA = {"model": "llama3-70b", "layers": 80}


def _bench(kind: str, name: str, layout: str, io: str, page: int) -> Any:
    backend = sgl_core.get_backend(name)
    case = bench.Case(backend, HostLayout(layout), IOBackend(io), page)
    extra: dict[str, Any] = MHA if kind == "mha" else {}
    cfg = bench.HicacheConfig(tokens=1024, shuffle_host=True, **extra)
    return bench._Bench(case, cfg)


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _reference(b: Any, threads: int) -> float:
    times = []
    for t in (1, threads):
        torch.set_num_threads(t)
        times.append(_timed(lambda: b.copy_host.copy_(b.copy_dev)))
    torch.set_num_threads(threads)
    return min(times)


def _restore(cal: _calibrate.Calibrator, kept: dict[str, Any], skips: dict[str, int]) -> None:
    for key, (_, calls) in cal.skipped().items():
        skips[key] = skips.get(key, 0) + calls
    cal.forget()
    cal._choices.update(copymod.deepcopy(kept))


def row(spec: tuple[str, str, str, str, int], args: argparse.Namespace) -> dict[str, Any]:
    cal = _calibrate.default_calibrator()
    cal.forget()
    real = _busy.team_fits
    threads = torch.get_num_threads()
    b = _bench(*spec)
    for _ in range(2):  # quiet: calibrate, then a warm call
        b.sgl_backup()
    kept = {c.key: c for c in cal.choices()}
    if args.force_team:
        for key, c in kept.items():
            if "0" in c.seconds and not key.startswith("stacked "):
                kept[key] = dataclasses.replace(c, choice="0")
    times: dict[str, list[float]] = {"check": [], "nocheck": [], "ref": []}
    skips: dict[str, int] = {}  # key -> calls whose team the check skipped
    with busy_processes(args.busy):
        time.sleep(0.5)
        for r in range(args.rounds):
            times["ref"].append(_reference(b, threads))
            for way in ("check", "nocheck") if r % 2 else ("nocheck", "check"):
                _restore(cal, kept, skips)
                _busy.team_fits = real if way == "check" else (lambda: True)
                try:
                    times[way].append(_timed(b.sgl_backup))
                finally:
                    _busy.team_fits = real
        _restore(cal, kept, skips)
        _busy.team_fits = lambda: True
        try:
            tail = [_timed(b.sgl_backup) for _ in range(args.tail)]
        finally:
            _busy.team_fits = real
        ref = min(times["ref"])
    out: dict[str, Any] = {
        "case": "/".join(str(s) for s in spec),
        "team_choices": sorted(k for k, c in kept.items() if c.choice == "0"),
        "tail_vs_ref": [round(ref / t, 3) for t in tail],
        "skipped": skips,
    }
    for way in ("check", "nocheck"):
        ts = times[way]
        out[f"{way}_best"] = round(ref / min(ts), 3)
        out[f"{way}_median"] = round(statistics.median(times["ref"]) / statistics.median(ts), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--busy", type=int, default=1)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--tail", type=int, default=6)
    p.add_argument("--force-team", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for spec in CASES:
        got = row(spec, args)
        rows.append(got)
        print(
            f"{got['case']:45} best check {got['check_best']:.2f} nocheck "
            f"{got['nocheck_best']:.2f} | median check {got['check_median']:.2f} nocheck "
            f"{got['nocheck_median']:.2f} | team keys {len(got['team_choices'])}, skipped "
            f"{sum(got['skipped'].values())} | nocheck in a row {got['tail_vs_ref']}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
