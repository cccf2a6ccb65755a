"""Reproduce BENCHMARKS.md's streaming-team figures (issue #27, ninth session): a per-layer
load's kept tables on two threads, the pool's sleeping threads against the spinning
team, quiet and beside one busy process; not shipped code.

Builds one ``sgl-bench hicache`` case as the benchmark does (torch backend, DeepSeek-V3
MLA rows, 61 layers x 4096 tokens, random host pages), pins every per-load key to
``stream2``, then times whole loads (61 calls) interleaved round by round, each way in
turn: ``pool`` (the call shares its table over the pool, as before the team and where
no team is mapped), ``one`` (the calling thread alone, as where the busy-core check says
no) and ``team S:W`` (the team, the helper spinning ``S`` pauses for the next call and
the lead ``W`` for the parts it did not take; the busy-core check bypassed, so the team
runs beside the busy process too), with the reference copy (the same bytes, contiguous,
ATen's threads) last in each round. Prints best and median GB/s per way.

    python scripts/stream_team_probe.py [--layout layer_first] [--page 16] \\
        [--spins 80000:4000,4000:4000] [--rounds 8]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from trial_calls_probe import pinned_bench

from sgl_core.transfer.copy import _calibrate, _stream_team
from sgl_core.transfer.copy._busy import settle
from sgl_core.transfer.copy._calibrate import Calibrator

BUSY = "while True: pass"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", default="layer_first")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--spins", default="80000:4000")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    cal = Calibrator(settle=settle, confirm_calls=3)
    _calibrate._default = cal
    bench = pinned_bench(args.layout, args.page, cal, "stream2")
    exact = bench.verify(bench.sgl_backup, bench.sgl_load, bench.backup_t)

    team = _stream_team.stream_team

    def way(kind: str, spins: tuple[int, int] = (0, 0)) -> Callable[[], None]:
        def run() -> None:
            setattr(_stream_team, "_quiet", lambda threads: kind == "team")  # noqa: B010
            setattr(_stream_team, "stream_team", (lambda: None) if kind == "pool" else team)  # noqa: B010
            if kind == "team":
                _stream_team.SERVE_PAUSES, _stream_team.WAIT_PAUSES = spins
            bench.sgl_load()

        return run

    ways = {"pool": way("pool"), "one": way("one")}
    for pair in args.spins.split(","):
        serve, wait = (int(x) for x in pair.split(":"))
        ways[f"team {serve}:{wait}"] = way("team", (serve, wait))
    ways["reference"] = lambda: bench.copy_dev.copy_(bench.copy_host)
    gb = bench.nbytes / 1e9
    for phase in ("quiet", "loaded"):
        busy = subprocess.Popen([sys.executable, "-c", BUSY]) if phase == "loaded" else None
        try:
            time.sleep(0.3)
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, fn in ways.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
        finally:
            if busy is not None:
                busy.kill()
        cells = [
            f"{name} {gb / min(t):.1f} / {gb / statistics.median(t):.1f}"
            for name, t in times.items()
        ]
        print(f"{args.layout} page {args.page}, {phase}, GB/s best / median: " + "; ".join(cells))
    print(f"bit-exact {exact}; team calls {_stream_team.team_calls()}")
    return 0 if all(exact) else 1


if __name__ == "__main__":
    sys.exit(main())
