"""`sgl-bench hicache --json` runs side by side: per row (backend, layout, page,
direction) and phase, best-of and median sgl/copy and the lowest round, before -> after.

    python scripts/bench_compare.py BEFORE.json AFTER.json
    python scripts/bench_compare.py OLD1.json,OLD2.json,OLD3.json NEW1.json,NEW2.json,NEW3.json

With several runs per side (an interleaved A/B: old, new, old, new, ...), "best" is the
best round of all runs, "median" the median of the runs' medians and "min" the lowest
round of all runs; a last column counts the runs whose median the after side beat.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

Key = tuple[str, ...]


def _rows(path: str) -> dict[Key, dict[str, Any]]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    out: dict[Key, dict[str, Any]] = {}
    for r in doc["records"]:
        if r["impl"] != "sgl":
            continue
        key = (r["phase"], r["backend"], r["layout"], str(r["page_size"]), r["direction"])
        out[key] = r
    return out


def _side(paths: str) -> dict[Key, list[dict[str, Any]]]:
    """Each row's records over the comma-separated runs (rows every run has)."""
    runs = [_rows(p) for p in paths.split(",")]
    return {k: [run[k] for run in runs] for k in runs[0] if all(k in run for run in runs)}


def _figures(recs: list[dict[str, Any]]) -> tuple[float, float, float]:
    best = max(r["best_ratio"] for r in recs)
    median = statistics.median(r["ratio"] for r in recs)
    return best, median, min(min(r["ratio_rounds"]) for r in recs)


def main(before: str, after: str) -> None:
    old, new = _side(before), _side(after)
    several = len(before.split(",")) > 1 or len(after.split(",")) > 1
    head = "| phase | backend | layout | page | dir | best before -> after | median | min |"
    print(head + (" after's median higher |" if several else ""))
    print("|---" * (9 if several else 8) + "|")
    for key in sorted(new, key=lambda k: (k[0] != "quiet", *k[1:3], int(k[3]), k[4])):
        if key not in old:
            continue
        a, b = _figures(old[key]), _figures(new[key])
        cells = [f"{x:.2f} -> {y:.2f}" for x, y in zip(a, b, strict=True)]
        if several:
            wins = sum(n["ratio"] > o["ratio"] for o, n in zip(old[key], new[key], strict=False))
            cells.append(f"{wins} of {min(len(old[key]), len(new[key]))}")
        print(f"| {' | '.join(key)} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
