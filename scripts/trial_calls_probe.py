"""Reproduce BENCHMARKS.md's trial-call figures (issue #27, eighth session): how a per-layer
load's real-call trial times its contenders, call by call; not shipped code.

Builds one ``sgl-bench hicache`` case as the benchmark does (torch backend, DeepSeek-V3 MLA
rows, 4096 tokens, random host pages, the round-trip check first), with a calibrator whose
trial never ends: every per-layer load call takes the next contender's turn. Prints each
contender's first calls and the median of its later ones, and the whole loads' GB/s.
``--pin NAME`` instead fixes every per-load key to one candidate (``stream1``,
``stream2``, ``1``, ...) and prints the whole loads' GB/s only: the steady state.
The trial times its first calls (``--warmup-s 0``, as these figures were taken); the
calibrator's own warm-up is ``Calibrator.confirm_warmup_s``. Since ``Trial.lead``, a
contender on several threads (``stream2``) is timed on the second call of each pair: its
first calls printed here are those second calls (BENCHMARKS.md's figures predate it).

    python scripts/trial_calls_probe.py [--layout layer_first] [--page 16] [--pin NAME]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from sgl_core.backends._discovery import get_backend
from sgl_core.cli._hicache import _Bench
from sgl_core.cli._hicache_plan import Case, HicacheConfig
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.transfer.copy import _calibrate
from sgl_core.transfer.copy._busy import settle
from sgl_core.transfer.copy._calibrate import Calibrator, CopyChoice

FIRST, LOADS = 12, 12


def _bench(layout: str, page: int) -> _Bench:
    case = Case(get_backend("torch"), HostLayout(layout), IOBackend("direct"), page)
    return _Bench(case, HicacheConfig(shuffle_host=True))


def pinned_bench(layout: str, page: int, cal: Calibrator, pin: str) -> _Bench:
    """The case on fresh pools with every per-load key of ``cal`` pinned to ``pin``: the
    keys are learnt on a first bench's load (a built step keeps its choice)."""
    _bench(layout, page).sgl_load()
    for key in [c.key for c in cal.choices() if "per load" in c.key]:
        cal._choices[key] = CopyChoice(key, pin, {pin: 1.0}, 1, "measured", "pin")
        cal._trials.open.pop(key, None)
    return _bench(layout, page)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="layer_first")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--pin", default=None)
    ap.add_argument("--warmup-s", type=float, default=0.0, help="the trial's untimed warm-up")
    args = ap.parse_args()
    calls = 3 if args.pin else 10**6
    cal = Calibrator(settle=settle, confirm_calls=calls, confirm_warmup_s=args.warmup_s)
    _calibrate._default = cal
    if args.pin:
        bench = pinned_bench(args.layout, args.page, cal, args.pin)
    else:
        bench = _bench(args.layout, args.page)
    exact = bench.verify(bench.sgl_backup, bench.sgl_load, bench.backup_t)
    times = []
    for _ in range(LOADS):
        start = time.perf_counter()
        bench.sgl_load()
        times.append(time.perf_counter() - start)
    gb = bench.nbytes / 1e9
    mode = f"pinned {args.pin}" if args.pin else "trial"
    print(
        f"{args.layout} page {args.page}, {mode}: whole loads GB/s best {gb / min(times):.1f}, "
        f"median {gb / statistics.median(times):.1f}; bit-exact {exact}"
    )
    for key, trial in cal._trials.open.items():
        if "per load" not in key:
            continue
        print(f"  {key}")
        for name, calls in trial.timed.items():
            first = ", ".join(f"{t * 1e3:.3f}" for _, t in calls[:FIRST])
            later = statistics.median(t for _, t in calls[3 * FIRST :]) * 1e3
            print(f"    {name}: first calls {first} ms; later median {later:.3f} ms")
    return 0 if all(exact) else 1


if __name__ == "__main__":
    sys.exit(main())
