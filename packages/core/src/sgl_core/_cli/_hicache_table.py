"""The ``hicache`` summary: table rows, the legend that explains them, and the goal lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sgl_core._cli._report import Record, interpreted_note

__all__ = [
    "GOALS_NOTE",
    "MIN_BASELINE_GBPS",
    "batch_line",
    "legend",
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


def _spread(r: Record) -> str:
    """The lowest and highest per-round sgl/copy (``-`` where the rounds were not kept)."""
    rounds = r.extra.get("ratio_rounds")
    return f"{_fmt(min(rounds))}-{_fmt(max(rounds))}" if rounds else "-"


def _key(r: Record) -> tuple[str, str, str, int, str]:
    return (r.backend, r.layout, r.io_backend, r.page_size, r.direction)


def summarize(
    records: Sequence[Record], interpreted: set[str] | frozenset[str] = frozenset()
) -> tuple[list[str], list[list[str]]]:
    """One row per (backend, layout/io, page, direction); ``*`` marks interpreted backends."""
    header = ["backend", "layout/io", "page", "dir", "sgl GB/s", "copy GB/s", "sgl/copy"]
    header.append("min-max")
    baselines = sorted({r.impl for r in records} - {"sgl", "copy"})
    header += [f"{b} GB/s" for b in baselines] + [f"sgl/{b}" for b in baselines] + ["bit-exact"]
    rows: list[list[str]] = []
    for r in records:
        if r.impl != "sgl":
            continue
        base = {b.impl: b for b in records if _key(b) == _key(r)}
        name = f"{r.backend}*" if r.backend in interpreted else r.backend
        rows.append(
            [name, f"{r.layout}/{r.io_backend}", str(r.page_size), r.direction]
            + [_fmt(r.gbps), _fmt(r.copy_gbps), _ratio(r.ratio, r.copy_gbps)]
            + [_spread(r)]
            + [_fmt(base[b].gbps) if b in base else "-" for b in baselines]
            + [_ratio(r.gbps / base[b].gbps, base[b].gbps) if b in base else "-" for b in baselines]
            + ["yes" if all(b.bit_exact is not False for b in base.values()) else "NO"]
        )
    return header, rows


def batch_line(records: Sequence[Record]) -> str:
    """What one call moves, per page size (the batch is rounded to whole pages)."""
    sizes: dict[int, tuple[int, int]] = {}
    for r in records:
        sizes.setdefault(r.page_size, (r.tokens, r.bytes))
    parts = [
        f"page {ps}: {tokens} tokens = {nbytes / 1e6:.0f} MB"
        for ps, (tokens, nbytes) in sorted(sizes.items())
    ]
    return "each call moves (all layers) " + "; ".join(parts)


def legend(records: Sequence[Record], interpreted: set[str] | frozenset[str]) -> list[str]:
    """Lines printed under the table: what each column and mark means."""
    impls = {r.impl for r in records}
    lines = [text for impl, text in _COLUMNS.items() if impl in impls]
    lines.append(
        "sgl/X = sgl GB/s divided by X GB/s (above 1: sgl is faster); bit-exact = the round "
        "trip (backup then load) returned every byte, checked before timing"
    )
    lines.append(
        "min-max = the lowest and highest sgl/copy over the paired rounds (each round times "
        "copy and sgl back to back); sgl/copy is the ratio of the medians"
    )
    lines.append(
        f"? after a ratio = its baseline ran below {MIN_BASELINE_GBPS} GB/s (Python overhead, "
        "not bytes moved): the ratio is not meaningful"
    )
    if interpreted:
        lines.append(interpreted_note(interpreted))
    return ["columns:", *(f"  {line}" for line in lines)]


def target_lines(
    records: Sequence[Record], interpreted: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """One line per goal that this run's cases cover (interpreted backends excluded)."""
    measured = [r for r in records if r.backend not in interpreted]
    sgl = [r for r in measured if r.impl == "sgl"]
    lines: list[str] = []
    goals: list[tuple[str, Callable[[Record], bool], float]] = [
        ("page >= 16: sgl >= 0.8x copy", lambda r: r.page_size >= 16, 0.8),
        ("page 1: sgl >= 0.3x copy", lambda r: r.page_size == 1, 0.3),
    ]
    for label, pick, goal in goals:
        mine = [r for r in sgl if pick(r)]
        if mine:
            worst = min(mine, key=lambda r: r.ratio)
            ok = worst.ratio >= goal
            lines.append(
                f"  goal {label}: {'met' if ok else 'NOT met'} (worst {worst.ratio:.2f}x: "
                f"{worst.backend} {worst.layout}/{worst.io_backend} page {worst.page_size} "
                f"{worst.direction})"
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
