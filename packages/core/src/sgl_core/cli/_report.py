"""Interleaved timing, records, machine facts, progress, tables (``rich`` when installed)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import torch

from sgl_core.transfer.copy._calibrate import host_id

__all__ = [
    "Progress",
    "Record",
    "interpreted_note",
    "median",
    "print_table",
    "pyplot",
    "time_interleaved",
    "write_outputs",
]

K = TypeVar("K", bound=Hashable)


@dataclasses.dataclass
class Record:
    """One measured (implementation, case, direction)."""

    impl: str
    backend: str
    layout: str
    io_backend: str
    page_size: int
    direction: str
    bytes: int
    seconds: float
    gbps: float
    copy_gbps: float
    ratio: float
    samples: int
    bit_exact: bool | None
    tokens: int = 0
    layers: int = 0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # more keys of its JSON row


def interpreted_note(names: Iterable[str], measured: str = "GB/s") -> str:
    """The footnote for rows marked ``*``: they ran in Triton's interpreter, timing is moot."""
    listed = ", ".join(sorted(names))
    return f"* {listed}: Triton interpreter on CPU: {measured} not meaningful (correctness only)"


def _mem_total_gb() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages / 1e9, 1)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": host_id()["cpu"],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mem_total_gb": _mem_total_gb(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(OSError):
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    return info


def write_outputs(
    args: argparse.Namespace,
    records: Sequence[Any],
    ok: bool,
    plot: Callable[[str], None] | None = None,
    **extra: Any,
) -> int:
    """Write ``--json`` (``{machine, records, **extra}``; a record is a dict or a dataclass,
    whose ``extra`` keys join its own) and, given ``plot``, ``--plot``; returns the exit
    status (0: ``ok``)."""
    if args.json:
        rows = [r if isinstance(r, dict) else dataclasses.asdict(r) for r in records]
        for row in rows:
            row.update(row.pop("extra", None) or {})
        doc = {"machine": machine_info(), "records": rows, **extra}
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if plot is not None and args.plot:
        plot(args.plot)
        print(f"wrote {args.plot}")
    return 0 if ok else 1


class Progress:
    """A rich progress bar when ``rich`` is installed and stderr is a terminal; else silent."""

    def __init__(self, total: int, description: str, *, enabled: bool = True) -> None:
        self._bar: Any = None
        self._task: Any = None
        if not enabled or not sys.stderr.isatty():
            return
        try:
            from rich.progress import Progress as RichProgress
        except ImportError:
            return
        self._bar = RichProgress(transient=True)
        self._task = self._bar.add_task(description, total=total)
        self._bar.start()

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=text)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A summary table: rich when installed and writing to a terminal, else aligned text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        Console = None  # type: ignore[assignment,misc]
    if Console is not None and sys.stdout.isatty():
        table = Table(title=title)
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i < 3 else "right")
        for row in rows:
            table.add_row(*row)
        Console(file=sys.stdout).print(table)
        return
    widths = [max(map(len, column)) for column in zip(header, *rows, strict=True)]
    print(title)
    for cells in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (the ``bench`` extra; imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sync(device: torch.device) -> None:
    """Wait for queued work on ``device`` (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(samples: list[float]) -> float:
    return float(statistics.median(samples)) if samples else float("nan")


def time_interleaved(
    ops: Mapping[K, Callable[[], None]],
    *,
    warmup: int,
    repeats: int,
    budget_s: float,
    device: torch.device,
    on_step: Callable[[], None] | None = None,
    prepare: Mapping[K, Callable[[], None]] | None = None,
) -> dict[K, list[float]]:
    """Seconds per call of every op, measured round-robin.

    Each round runs every op once, so slow drifts of the machine (other
    processes, frequency, page cache) hit all ops alike. The first ``warmup``
    rounds are not recorded. An op that has spent more than ``budget_s`` and
    has one recorded sample sits out later rounds (slow baselines).
    ``prepare[key]``, if given, runs untimed before each call of ``ops[key]``
    (e.g. to restore inputs an in-place op consumed).
    """
    samples: dict[K, list[float]] = {key: [] for key in ops}
    spent: dict[K, float] = dict.fromkeys(ops, 0.0)
    for round_no in range(warmup + repeats):
        for key, fn in ops.items():
            if round_no > warmup and samples[key] and spent[key] > budget_s:
                continue
            if prepare is not None and key in prepare:
                prepare[key]()
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            elapsed = time.perf_counter() - start
            spent[key] += elapsed
            if round_no >= warmup:
                samples[key].append(elapsed)
        if on_step is not None:
            on_step()
    return samples
