"""CPU-time A/B of ``sgl-bench hicache`` cases between two trees, for a loaded machine.

Wall-clock rounds cannot resolve 10-30% while other processes load the cores.
This runs the bench's own cases (``_Bench``: same pools, indices, host-slot
mode and contiguous-copy baseline) and times each op with process CPU time,
which leaves out the time other processes hold the cores. Run it on one torch
thread, once per (tree, host mode, page size), alternating the trees::

    OMP_NUM_THREADS=1 PYTHONPATH=<tree>/packages/core/src:<tree>/packages/cuda/src:\\
<tree>/packages/ascend/src python scripts/hicache_cpu_ab.py run 1 1024 5 0 out/before_r1_s0_p1.json

then ``python scripts/hicache_cpu_ab.py table out`` (file names start with the
tree's name and ``_``). Per process: ratio = min copy CPU time / min sgl CPU
time over the repeats (higher is better); the table gives per row the median
and best over processes, after/before, and ``noise``, the larger relative
spread (max - min) / median of either tree's ratios.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path


def run(page_size: int, tokens: int, repeats: int, shuffle: bool, out: Path) -> None:
    import sgl_core
    from sgl_core._cli._hicache import Case, HicacheConfig, _Bench

    records: list[dict[str, object]] = []
    for name in ("torch", "ascend"):
        backend = sgl_core.get_backend(name)
        for layout, ios in backend.supported_pairs.items():
            for io in sorted(ios, key=lambda i: i.value):
                cfg = HicacheConfig(tokens=tokens, shuffle_host=shuffle)
                bench = _Bench(Case(backend, layout, io, page_size), cfg)
                ops: dict[str, Callable[[], None]] = {
                    "copy_backup": bench.copy_backup,
                    "sgl_backup": bench.sgl_backup,
                    "copy_load": bench.copy_load,
                    "sgl_load": bench.sgl_load,
                }
                times: dict[str, list[float]] = {k: [] for k in ops}
                for op in ops.values():  # warm-up
                    op()
                for _ in range(repeats):
                    for key, op in ops.items():
                        start = time.process_time()
                        op()
                        times[key].append(time.process_time() - start)
                for direction in ("backup", "load"):
                    sgl, copy = times["sgl_" + direction], times["copy_" + direction]
                    records.append(
                        {
                            "backend": name,
                            "layout": layout.value,
                            "page_size": page_size,
                            "direction": direction,
                            "shuffle": shuffle,
                            "ratio_min": min(copy) / min(sgl),
                        }
                    )
                del bench
    out.write_text(json.dumps(records))


def table(folder: Path) -> None:
    Key = tuple[bool, str, str, int, str]
    rows: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(folder.glob("*.json")):
        side = path.stem.split("_")[0]
        for r in json.loads(path.read_text()):
            key: Key = (r["shuffle"], r["backend"], r["layout"], r["page_size"], r["direction"])
            rows[key][side].append(r["ratio_min"])
    print("host    backend layout              page dir      n before  after   a/b  best noise")
    for key in sorted(rows):
        b, a = rows[key]["before"], rows[key]["after"]
        if not a or not b:
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        noise = max((max(b) - min(b)) / mb, (max(a) - min(a)) / ma)
        host = "shuffle" if key[0] else "alloc"
        print(
            f"{host:7} {key[1]:6} {key[2]:19} {key[3]:>4} {key[4]:6} "
            f"{min(len(a), len(b)):>3} {mb:6.3f} {ma:6.3f} {ma / mb:5.2f} "
            f"{max(a) / max(b):5.2f} {noise:5.2f}"
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["run"] and len(argv) == 6:
        run(int(argv[1]), int(argv[2]), int(argv[3]), argv[4] == "1", Path(argv[5]))
    elif argv[:1] == ["table"] and len(argv) == 2:
        table(Path(argv[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
