"""Two `sgl-bench hicache --json` runs side by side: per row (backend, layout, page,
direction) and phase, best-of and median sgl/copy and the lowest round, before -> after.

    python scripts/bench_compare.py BEFORE.json AFTER.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _rows(path: str) -> dict[tuple[str, ...], dict[str, Any]]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in doc["records"]:
        if r["impl"] != "sgl":
            continue
        key = (r["phase"], r["backend"], r["layout"], str(r["page_size"]), r["direction"])
        out[key] = r
    return out


def main(before: str, after: str) -> None:
    old, new = _rows(before), _rows(after)
    print("| phase | backend | layout | page | dir | best before -> after | median | min |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(new, key=lambda k: (k[0] != "quiet", *k[1:3], int(k[3]), k[4])):
        a, b = old.get(key), new[key]
        if a is None:
            continue
        cells = [f"{a[f]:.2f} -> {b[f]:.2f}" for f in ("best_ratio", "ratio")] + [
            f"{min(a['ratio_rounds']):.2f} -> {min(b['ratio_rounds']):.2f}"
        ]
        print(f"| {' | '.join(key)} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
