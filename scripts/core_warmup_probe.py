"""Reproduce BENCHMARKS.md's warm-up figures (issue #27, eleventh session): how a per-layer
load's first calls after an idle pause compare with its later ones, on one thread
(``stream1``) and on the streaming team (``stream2``); not shipped code.

Builds one ``sgl-bench hicache`` case as the benchmark does (torch backend, DeepSeek-V3 MLA
rows, random host pages), keeps each layer's ``stream1`` and ``stream2`` load steps, and
times sequences of calls, each started as a calibration's trial starts: the caches
evicted, the process's other threads asleep (``_busy.settle``), then a 50 ms pause. Prints
the median over ``--reps`` sequences of each call in the sequence, in ms:
``stream2`` twelve times, ``stream1`` and ``stream2`` alternating (a trial's turns), and
``stream1`` twelve times.

    python scripts/core_warmup_probe.py [--layout page_first] [--page 16] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from trial_calls_probe import _bench

from sgl_core.transfer.copy import _calibrate, _evict, _steps
from sgl_core.transfer.copy._busy import settle
from sgl_core.transfer.copy._calibrate import Calibrator


def kept_steps(layout: str, page: int) -> tuple[Any, list[tuple[_steps.Step, _steps.Step]]]:
    """The case, and each layer's load as ``(stream1, stream2)`` steps, built by one load
    of it (the steps copy by raw address: the case's pools must outlive them)."""
    _calibrate._default = Calibrator(settle=settle, confirm_calls=0)
    steps: list[tuple[_steps.Step, _steps.Step]] = []
    resolve = _steps._resolve

    def grab(
        threads: int, key: str, nbytes: int, build: Any, parts: int, stream: Any = None
    ) -> Any:
        if stream is not None and "per load" in key:
            steps.append((stream(1), stream(2)))
        return resolve(threads, key, nbytes, build, parts, stream)

    _steps._resolve = grab
    bench = _bench(layout, page)
    try:
        bench.sgl_load()
    finally:
        _steps._resolve = resolve
    return bench, steps


def sequence(
    steps: list[tuple[_steps.Step, _steps.Step]], pattern: list[int], reps: int
) -> list[float]:
    """The median ms of each call of ``pattern`` (0: ``stream1``, 1: ``stream2``), each
    repetition on other layers, after the caches are evicted and the threads asleep."""
    out: list[list[float]] = [[] for _ in pattern]
    for rep in range(reps):
        _evict.evict_caches()
        settle()
        time.sleep(0.05)
        for i, which in enumerate(pattern):
            run: Callable[[], None] = steps[(i + 7 * rep) % len(steps)][which].run
            start = time.perf_counter()
            run()
            out[i].append(time.perf_counter() - start)
    return [statistics.median(v) * 1e3 for v in out]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="page_first")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    bench, steps = kept_steps(args.layout, args.page)
    if not steps:
        print("no streaming load steps here (no streaming copy?)")
        return 1
    print(f"{args.layout} page {args.page}: {len(steps)} layers, median ms per call")
    for name, pattern in (
        ("stream2 x12", [1] * 12),
        ("stream1, stream2 x6", [0, 1] * 6),
        ("stream1 x12", [0] * 12),
    ):
        ms = sequence(steps, pattern, args.reps)
        print(f"  {name.ljust(20)}", " ".join(f"{x:.3f}" for x in ms))
    del bench  # (alive until here: the steps copy its pools' bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
