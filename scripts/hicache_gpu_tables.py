"""Markdown tables from a ``gpu_hicache.py`` JSON (for BENCHMARKS.md).

python scripts/hicache_gpu_tables.py docs/gpu-h200/hicache.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

OPS = (
    ("backup_all_layers", "backup"),
    ("load_all_layers", "load all"),
    ("load_one_layer", "load one"),
)


def main_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| page | host layout | io | mode | "
        + " | ".join(label for _, label in OPS)
        + " | exact |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in OPS) + " | --- |",
    ]
    keys: dict[tuple[int, str, str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        keys.setdefault((r["page"], r["layout"], r["io"], r["mode"]), {})[r["op"]] = r
    for (page, layout, io, mode), ops in keys.items():
        cells = []
        for op, _ in OPS:
            r = ops.get(op)
            cells.append(
                f"{r['ratio']:.2f}x / {r['ratio_median']:.2f}x ({r['gbps']:.1f} GB/s)" if r else "-"
            )
        err = ops.get("error")
        exact = (
            "error: " + err["error"].splitlines()[-1][:60]
            if err
            else ("yes" if all(r["exact"] for r in ops.values()) else "NO")
        )
        out.append(f"| {page} | {layout} | {io} | {mode} | " + " | ".join(cells) + f" | {exact} |")
    return out


def sweep_table(sweep: dict[str, Any]) -> list[str]:
    out = [
        "| host layout | op | variant | best | median | GPU ms/call | CPU ms/call | exact |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sweep.get("rows", []):
        out.append(
            f"| {r['layout']} | {r['op']} | {r['variant']} | {r['ratio']:.2f}x | "
            f"{r['ratio_median']:.2f}x | {r['best_ms']:.3f} | {r['cpu_ms']:.3f} | "
            f"{'yes' if r['exact'] else 'NO'} |"
        )
    return out


def sm_table(sm: dict[str, Any]) -> list[str]:
    out = [
        f"{sm.get('n_gemm')} bf16 GEMMs of {sm.get('gemm_n')}^2 on one stream "
        f"({sm.get('gemm_tflops', 0):.0f} TFLOP/s alone), the io on another:",
        "",
        "| io | mode | matmul slowdown | io GB/s alone | io GB/s beside the matmul |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in sm.get("rows", []):
        out.append(
            f"| {r['io']} | {r['mode']} | {r['matmul_slowdown']:.3f}x | "
            f"{r['io_alone_gbps']:.1f} | {r['io_contended_gbps']:.1f} |"
        )
    return out


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as f:
        data = json.load(f)
    meta = data["meta"]
    print(
        f"<!-- {meta.get('device')} torch {meta.get('torch')} cudart {meta.get('cuda_runtime')} -->"
    )
    print("\n".join(main_table(data["rows"])))
    if "sweep" in data and "rows" in data["sweep"]:
        print()
        print("\n".join(sweep_table(data["sweep"])))
    if "smbudget" in data and "rows" in data["smbudget"]:
        print()
        print("\n".join(sm_table(data["smbudget"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
