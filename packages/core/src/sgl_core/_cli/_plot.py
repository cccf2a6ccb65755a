"""PNG plots of benchmark records (matplotlib, Agg backend, imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from sgl_core._cli._moe_bench import MoERecord
from sgl_core._cli._report import Record

__all__ = ["plot_hicache", "plot_moe"]

_STYLE: dict[str, dict[str, Any]] = {
    "sgl": {"color": "tab:blue", "marker": "o", "linestyle": "-", "linewidth": 2.2},
    "per_page": {"color": "tab:orange", "marker": "s", "linestyle": "--"},
    "per_token": {"color": "tab:red", "marker": "^", "linestyle": ":"},
    "copy": {"color": "black", "marker": "", "linestyle": "-.", "linewidth": 1.2},
}


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_hicache(records: Sequence[Record], path: str) -> None:
    """One panel per (direction, backend/layout/io): GB/s by page size per impl, copy limit."""
    plt = _pyplot()
    pairs = sorted({(r.backend, r.layout, r.io_backend) for r in records})
    directions = ("backup", "load")
    fig, axes = plt.subplots(
        len(directions),
        len(pairs),
        figsize=(3.6 * len(pairs) + 1, 6.5),
        squeeze=False,
        sharey=True,
    )
    page_sizes = sorted({r.page_size for r in records})
    top = 1.1 * max((r.gbps for r in records), default=1.0)
    for col, pair in enumerate(pairs):
        for row, direction in enumerate(directions):
            ax = axes[row][col]
            mine = [r for r in records if (r.backend, r.layout, r.io_backend) == pair]
            mine = [r for r in mine if r.direction == direction]
            for impl in ("copy", "sgl", "per_page", "per_token"):
                pts = sorted((r.page_size, r.gbps) for r in mine if r.impl == impl)
                if not pts:
                    continue
                label = "contiguous copy (limit)" if impl == "copy" else impl
                ax.plot([p for p, _ in pts], [g for _, g in pts], label=label, **_STYLE[impl])
            ax.set_xscale("log", base=2)
            ax.set_xticks(page_sizes, [str(p) for p in page_sizes])
            ax.grid(True, alpha=0.3)
            ax.set_ylim(0, top)
            if row == 0:
                ax.set_title(f"{pair[0]}: {pair[1]} / {pair[2]}", fontsize=10)
            if row == len(directions) - 1:
                ax.set_xlabel("page size (tokens)")
            if col == 0:
                ax.set_ylabel(f"{direction}  GB/s")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("sgl-bench hicache: host-pool transfer bandwidth (DeepSeek-V3 MLA shape)")
    fig.legend(
        handles, labels, loc="upper center", ncol=4, frameon=False, bbox_to_anchor=(0.5, 0.95)
    )
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_moe(records: Sequence[MoERecord], path: str) -> None:
    """Milliseconds per call of every timed MoE op, one panel per op."""
    plt = _pyplot()
    ops = list(dict.fromkeys(r.op for r in records))
    width = max(1, len(ops))
    fig, axes = plt.subplots(1, width, figsize=(4.4 * width, 4.2), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=False):
        mine = [r for r in records if r.op == op]
        ms = [r.seconds * 1e3 for r in mine]
        ax.bar(
            [r.impl for r in mine], ms, color=["tab:blue", "tab:orange", "tab:green"][: len(mine)]
        )
        for i, value in enumerate(ms):
            ax.annotate(f"{value:.2f} ms", (i, value), ha="center", va="bottom")
        ax.set_title(f"{op}\n{mine[0].shape} {mine[0].dtype}", fontsize=9)
        ax.set_ylabel("ms per call (lower is better)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("sgl-bench moe")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
