"""The ``l3`` subcommand: L3 page-store set/get bandwidth (``sgl_core.l3._bench``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from sgl_core._cli._report import machine_info, print_table

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "l3",
        help="L3 page-store set/get GB/s vs memcpy",
        description="L3 page-store set/get GB/s vs memcpy. Mooncake runs only inside a private "
        "network namespace with only loopback (needs root; skipped otherwise), since its "
        "client listens on every interface.",
    )
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--pages", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--layout", default="page_first_direct")
    p.add_argument("--json", metavar="PATH", help="write {machine, records} as JSON")
    p.add_argument("--layers", type=int, default=61, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sgl_core.l3._bench import run_l3_bench

    started = time.perf_counter()
    notes: list[str] = []
    records = run_l3_bench(
        page_size=args.page_size,
        pages=args.pages,
        repeats=args.repeats,
        layout=args.layout,
        layer_num=args.layers,
        notes=notes,
    )
    for note in notes:
        print(note)
    keys = list(dict.fromkeys(k for r in records for k in r))
    rows = [
        [f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys]
        for r in records
    ]
    print_table("sgl-bench l3", keys, rows)
    print(f"wall time: {time.perf_counter() - started:.1f} s")
    if args.json:
        doc = {"machine": machine_info(), "notes": notes, "records": records}
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    ok = all(r.get("verified", True) is not False for r in records)
    return 0 if ok else 1
