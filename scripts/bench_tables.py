"""Render `sgl-bench hicache --json` output as the Markdown table in BENCHMARKS.md.

    python scripts/bench_tables.py hicache.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    data = json.load(open(path, encoding="utf-8"))
    rows: dict[tuple[str, str, int, str], dict[str, float]] = defaultdict(dict)
    copy: dict[tuple[str, str, int, str], float] = {}
    for r in data["records"]:
        key = (r["backend"], f"{r['layout']}/{r['io_backend']}", r["page_size"], r["direction"])
        rows[key][r["impl"]] = r["gbps"]
        copy[key] = r["copy_gbps"]
    print("| backend | layout/io | page | dir | sgl GB/s | copy GB/s | sgl/copy | per_page | per_token | x per_token |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rows):
        impl = rows[key]
        sgl = impl["sgl"]
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {sgl:.2f} | {copy[key]:.2f} | "
            f"{sgl / copy[key]:.2f} | {impl.get('per_page', float('nan')):.2f} | "
            f"{impl.get('per_token', float('nan')):.2f} | {sgl / impl.get('per_token', float('nan')):.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
