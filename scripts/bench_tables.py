"""Render `sgl-bench hicache --json` output as the Markdown table in BENCHMARKS.md.

Usage: ``python scripts/bench_tables.py hicache.json``
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

HEADER = (
    "| backend | layout/io | page | dir | sgl GB/s | copy GB/s | sgl/copy "
    "| per_page | per_token | x per_token |"
)


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows: dict[tuple[str, str, int, str], dict[str, float]] = defaultdict(dict)
    copy: dict[tuple[str, str, int, str], float] = {}
    for r in data["records"]:
        key = (r["backend"], f"{r['layout']}/{r['io_backend']}", r["page_size"], r["direction"])
        rows[key][r["impl"]] = r["gbps"]
        copy[key] = r["copy_gbps"]
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for key in sorted(rows):
        impl = rows[key]
        sgl = impl["sgl"]
        per_page, per_token = impl.get("per_page", nan), impl.get("per_token", nan)
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {sgl:.2f} | {copy[key]:.2f} | "
            f"{sgl / copy[key]:.2f} | {per_page:.2f} | {per_token:.2f} | {sgl / per_token:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
