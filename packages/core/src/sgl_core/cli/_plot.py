"""PNG plots of benchmark records (matplotlib, Agg backend, imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from sgl_core.cli._moe_bench import MoERecord
from sgl_core.cli._report import Record

__all__ = ["plot_hicache", "plot_moe"]

_STYLE: dict[str, dict[str, Any]] = {
    "sgl": {"color": "tab:blue", "marker": "o", "linestyle": "-", "linewidth": 2.2},
    "per_page": {"color": "tab:orange", "marker": "s", "linestyle": "--"},
    "per_token": {"color": "tab:red", "marker": "^", "linestyle": ":"},
    "copy": {"color": "black", "marker": "", "linestyle": "-.", "linewidth": 1.2},
    "fixed": {"color": "tab:gray", "marker": "D", "linestyle": "--"},
}


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_hicache(records: Sequence[Record], path: str) -> None:
    """GB/s of every impl beside the copy limit: by page size, or bars where one page ran.

    Several page sizes: one panel per (direction, backend/layout/io), a line per
    impl over page size. One page size: one panel per direction, a group of
    bars per backend/layout/io (a line plot would show one dot per panel).
    """
    plt = _pyplot()
    fig = _lines(plt, records) if len({r.page_size for r in records}) > 1 else _bars(plt, records)
    fig.suptitle("sgl-bench hicache: host-pool transfer bandwidth")
    fig.savefig(path, dpi=110)
    plt.close(fig)


_IMPLS = ("copy", "sgl", "fixed", "per_page", "per_token")


def _label(impl: str) -> str:
    return "contiguous copy (limit)" if impl == "copy" else impl


def _bars(plt: Any, records: Sequence[Record]) -> Any:
    pairs = sorted({(r.backend, r.layout, r.io_backend) for r in records})
    impls = [i for i in _IMPLS if any(r.impl == i for r in records)]
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 2.2 * len(pairs) + 3), 4.8), squeeze=False)
    width = 0.8 / max(len(impls), 1)
    for ax, direction in zip(axes[0], ("backup", "load"), strict=True):
        for k, impl in enumerate(impls):
            got = {(r.backend, r.layout, r.io_backend): r.gbps for r in records
                   if r.impl == impl and r.direction == direction}  # fmt: skip
            xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(pairs))]
            ax.bar(xs, [got.get(p, 0.0) for p in pairs], width, label=_label(impl),
                   color=_STYLE[impl]["color"])  # fmt: skip
        ax.set_xticks(range(len(pairs)), [f"{b}\n{lay}/{io}" for b, lay, io in pairs], fontsize=8)
        ax.set_title(f"{direction}, page {records[0].page_size}" if records else direction)
        ax.set_ylabel("GB/s (higher is better)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def _lines(plt: Any, records: Sequence[Record]) -> Any:
    pairs = sorted({(r.backend, r.layout, r.io_backend) for r in records})
    directions = ("backup", "load")
    fig, axes = plt.subplots(
        len(directions), len(pairs), figsize=(3.6 * len(pairs) + 1, 6.5), squeeze=False, sharey=True
    )
    page_sizes = sorted({r.page_size for r in records})
    top = 1.1 * max((r.gbps for r in records), default=1.0)
    for col, pair in enumerate(pairs):
        for row, direction in enumerate(directions):
            ax = axes[row][col]
            mine = [r for r in records if (r.backend, r.layout, r.io_backend) == pair]
            mine = [r for r in mine if r.direction == direction]
            for impl in _IMPLS:
                pts = sorted((r.page_size, r.gbps) for r in mine if r.impl == impl)
                if pts:
                    style = {**_STYLE[impl], "marker": _STYLE[impl]["marker"] or "_"}
                    ax.plot([p for p, _ in pts], [g for _, g in pts], label=_label(impl), **style)
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
    fig.legend(
        handles, labels, loc="upper center", ncol=5, frameon=False, bbox_to_anchor=(0.5, 0.95)
    )
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


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
