"""The ``hicache`` summary: table rows, the legend that explains them, the goal lines, the plot."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from sgl_core.cli._report import Record, interpreted_note, pyplot

__all__ = [
    "GOALS_NOTE",
    "MIN_BASELINE_GBPS",
    "batch_lines",
    "legend",
    "plot_hicache",
    "summarize",
    "target_lines",
]

#: A baseline slower than this moves almost no bytes per unit of time: its time is
#: Python per-call overhead (one slice copy per page, each ~10 us), so ``sgl/X`` against
#: it measures that loop, swings several-fold between runs, and reads as a huge speedup.
#: Ratios against such a baseline are printed with a trailing ``?``.
MIN_BASELINE_GBPS = 0.1

GOALS_NOTE = (
    "goals (the project's performance targets; informational: they do not change the exit status)"
)

_COLUMNS = {
    "sgl": "sgl = this package: backup = one backup_from_device_all_layer call (all layers), "
    "load = one load_to_device_per_layer call per layer",
    "copy": "copy = one contiguous copy_ of the same bytes between the same two devices: "
    "the bandwidth limit of this machine",
    "per_page": "per_page = baseline: per layer, a Python loop of one slice copy per page",
    "per_token": "per_token = baseline: per layer, index_select of the tokens, then an indexed "
    "write",
}


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def _ratio(ratio: float, baseline_gbps: float) -> str:
    """A ratio, marked ``?`` when its baseline is too slow to compare with."""
    return _fmt(ratio) + ("?" if baseline_gbps < MIN_BASELINE_GBPS else "")


def _key(r: Record) -> tuple[str, str, str, int, str]:
    return (r.backend, r.layout, r.io_backend, r.page_size, r.direction)


def _best(r: Record) -> str:
    best = r.extra.get("best_ratio")
    return _fmt(best) if isinstance(best, float) else "-"


def summarize(
    records: Sequence[Record], interpreted: set[str] | frozenset[str] = frozenset()
) -> tuple[list[str], list[list[str]]]:
    """One row per (backend, layout/io, page, direction); ``*`` marks interpreted backends.

    Baselines appear as ratios only (their GB/s are in the JSON); the
    backend column only where the run has more than one backend.
    """
    several = len({r.backend for r in records}) > 1 or bool(interpreted)
    one_io = len({r.io_backend for r in records}) == 1  # then named in the title, not per row
    header = ["backend"] if several else []
    header += ["layout" if one_io else "layout/io", "page", "dir", "sgl", "copy", "sgl/copy"]
    header += ["best", "min-max"]
    fixed = any(r.impl == "fixed" for r in records)
    if fixed:
        header += ["fixed/copy", "fixed best"]
    baselines = sorted({r.impl for r in records} - {"sgl", "copy", "fixed"})
    header += [f"sgl/{b.removeprefix('per_')}" for b in baselines] + ["exact"]
    rows: list[list[str]] = []
    for r in records:
        if r.impl != "sgl":
            continue
        base = {b.impl: b for b in records if _key(b) == _key(r)}
        name = f"{r.backend}*" if r.backend in interpreted else r.backend
        row = [name] if several else []
        row += [r.layout if one_io else f"{r.layout}/{r.io_backend}", str(r.page_size), r.direction]
        rounds = r.extra.get("ratio_rounds")  # lowest-highest per-round sgl/copy, if kept
        spread = f"{_fmt(min(rounds))}-{_fmt(max(rounds))}" if rounds else "-"
        row += [_fmt(r.gbps), _fmt(r.copy_gbps), _ratio(r.ratio, r.copy_gbps), _best(r), spread]
        if fixed:
            f = base.get("fixed")
            row += [_fmt(f.ratio), _best(f)] if f is not None else ["-", "-"]
        row += [
            _ratio(r.gbps / base[b].gbps, base[b].gbps) if b in base else "-" for b in baselines
        ]
        row.append("yes" if all(b.bit_exact is not False for b in base.values()) else "NO")
        rows.append(row)
    return header, rows


def batch_lines(records: Sequence[Record]) -> list[str]:
    """What one call moves, per page size (the batch is rounded to whole pages)."""
    sizes: dict[int, tuple[int, int, int]] = {}
    for r in records:
        sizes.setdefault(r.page_size, (r.tokens, r.bytes, max(r.layers, 1)))
    layers = max((r.layers for r in records), default=0)
    lines = [
        f"one backup call moves all {layers} layers; a load row times {layers} calls, one layer"
    ]
    lines += [
        f"  page {ps}: {tokens} tokens = {nbytes / 1e6:.0f} MB per backup call, "
        f"{nbytes / layers / 1e6:.1f} MB per load call"
        for ps, (tokens, nbytes, layers) in sorted(sizes.items())
    ]
    return lines


_LEGEND = [
    "sgl, copy = GB/s; sgl/X = sgl GB/s divided by X GB/s (above 1: sgl is faster; "
    "sgl/page, sgl/token: the per_page, per_token baselines); exact = the round trip "
    "(backup then load) returned every byte, checked before timing",
    "copy = per round, the faster of the contiguous copy at 1 and at N torch threads (the "
    "engine's count); sgl/copy = the ratio of the medians, best = of the best rounds, "
    "min-max = the lowest and highest ratio of one round (copy and sgl timed back to back)",
    f"? after a ratio = its baseline ran below {MIN_BASELINE_GBPS} GB/s (Python overhead, "
    "not bytes moved): the ratio is not meaningful",
]


def legend(records: Sequence[Record], interpreted: set[str] | frozenset[str]) -> list[str]:
    """Lines printed under the table: what each column and mark means (wrapped at 100)."""
    impls = {r.impl for r in records}
    lines = [text for impl, text in _COLUMNS.items() if impl in impls] + _LEGEND
    if "fixed" in impls:
        lines.append(
            "fixed = the same pools with the old fixed copy tuning (copy_threads 0: ATen's "
            "threads), timed in the same rounds; fixed/copy and fixed best as for sgl"
        )
    if interpreted:
        lines.append(interpreted_note(interpreted))
    out = ["columns:"]
    for line in lines:
        out += textwrap.wrap(line, 100, initial_indent="  ", subsequent_indent="    ")
    return out


def target_lines(
    records: Sequence[Record], interpreted: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """One line per goal that this run's cases cover (interpreted backends excluded)."""
    measured = [r for r in records if r.backend not in interpreted]
    sgl = [r for r in measured if r.impl == "sgl"]
    lines: list[str] = []
    goals: list[tuple[str, Callable[[Record], bool], float, bool]] = [
        ("page >= 16", lambda r: r.page_size >= 16, 0.8, True),
        ("page >= 16", lambda r: r.page_size >= 16, 0.6, False),
        ("page 1", lambda r: r.page_size == 1, 0.3, True),
    ]
    for label, pick, goal, best in goals:
        mine = [r for r in sgl if pick(r)]
        if not mine:
            continue
        ran = ", ".join(str(p) for p in sorted({r.page_size for r in mine}))

        def value(r: Record, best: bool = best) -> float:
            b = r.extra.get("best_ratio")
            return float(b) if best and isinstance(b, float) else r.ratio

        worst = min(mine, key=value)
        ok = value(worst) >= goal
        lines.append(
            f"  goal {label} (ran {ran}), sgl/copy {'best-of' if best else 'median'} >= {goal}: "
            f"{'met' if ok else 'NOT met'} (worst {value(worst):.2f}: {worst.backend} "
            f"{worst.layout}/{worst.io_backend} page {worst.page_size} {worst.direction})"
        )
    tok = {_key(r): r for r in measured if r.impl == "per_token" and r.page_size == 64}
    speedups = [r.gbps / tok[_key(r)].gbps for r in sgl if _key(r) in tok]
    if speedups:
        ok = min(speedups) >= 3.0
        lines.append(
            f"  goal page 64: sgl >= 3x per_token: {'met' if ok else 'NOT met'} "
            f"(worst {min(speedups):.1f}x)"
        )
    return [GOALS_NOTE, *lines] if lines else []


_STYLE: dict[str, dict[str, Any]] = {
    "sgl": {"color": "tab:blue", "marker": "o", "linestyle": "-", "linewidth": 2.2},
    "per_page": {"color": "tab:orange", "marker": "s", "linestyle": "--"},
    "per_token": {"color": "tab:red", "marker": "^", "linestyle": ":"},
    "copy": {"color": "black", "marker": "", "linestyle": "-.", "linewidth": 1.2},
    "fixed": {"color": "tab:gray", "marker": "D", "linestyle": "--"},
}


def plot_hicache(records: Sequence[Record], path: str) -> None:
    """GB/s of every impl beside the copy limit: by page size, or bars where one page ran.

    Several page sizes: one panel per (direction, backend/layout/io), a line per
    impl over page size. One page size: one panel per direction, a group of
    bars per backend/layout/io (a line plot would show one dot per panel).
    """
    plt = pyplot()
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
