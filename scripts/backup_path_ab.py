"""Wall-clock A/B of stacked CPU backups: today's path choice against torch's run copies.

"new" is the code as it is (with ``copy_threads`` AUTO a stacked backup part of 1 MiB or
more is decided by the calibrator, ``sgl_core.transfer._direct_load.backup_path``);
"old" sets the slice limits to 0, which brings back the torch run copies. Both run in one
process on their own pools, alternated for 15 rounds, each beside a contiguous copy of the
same bytes; random host pages (``--shuffle-host``), 1024 tokens, DeepSeek-V3 MLA and
llama3-70b MHA rows, pages 16 and 64, every torch and ascend pair but ``layer_first``::

    PYTHONPATH=packages/core/src:packages/cuda/src:packages/ascend/src \\
        python scripts/backup_path_ab.py [out.json]

Run it once quiet and once beside a busy process (``python -c "while True: pass" &``).
It prints, per row, new/old speed (best-of and median) and each side against the copy,
then what the calibrator chose for each backup shape.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import sgl_ascend._transfer as ascend_transfer
import sgl_core
import sgl_core.transfer._direct_load as direct_load
from sgl_core.backend import copy_calibration

sys.path.insert(0, str(Path(__file__).parent))
ab = importlib.import_module("hicache_cpu_ab")
bench = importlib.import_module("sgl_core.cli._hicache")

LIMITS = (direct_load.SLICES_MAX_RUN_BYTES, ascend_transfer._SLICES_MAX_RUN_BYTES)
ROUNDS = 15


def _setting(new: bool) -> None:
    direct_load.SLICES_MAX_RUN_BYTES = LIMITS[0] if new else 0
    ascend_transfer._SLICES_MAX_RUN_BYTES = LIMITS[1] if new else 0


def _config(kind: str) -> object:
    if kind == "mha":
        return bench.HicacheConfig(
            tokens=1024, shuffle_host=True, model=ab.MHA_MODEL, layers=ab.MHA_LAYERS
        )
    return bench.HicacheConfig(tokens=1024, shuffle_host=True)


def _row(kind: str, name: str, layout: object, io: object, page: int) -> dict[str, object]:
    backend = sgl_core.get_backend(name)
    case = bench.Case(backend, layout, io, page)
    benches = {new: bench._Bench(case, _config(kind)) for new in (True, False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    copy: list[float] = []
    for new in (True, False):  # warm-up (and the calibrator's first measurement)
        _setting(new)
        benches[new].sgl_backup()
    for r in range(ROUNDS):
        for new in (True, False) if r % 2 else (False, True):
            _setting(new)
            start = time.perf_counter()
            benches[new].sgl_backup()
            times[new].append(time.perf_counter() - start)
        host, dev = benches[True].copy_host, benches[True].copy_dev
        start = time.perf_counter()
        host.copy_(dev)
        copy.append(time.perf_counter() - start)
    _setting(True)
    best, med = min, statistics.median
    return {
        "kind": kind,
        "backend": name,
        "layout": getattr(layout, "value", layout),
        "io": getattr(io, "value", io),
        "page_size": page,
        "new_over_old_best": best(times[False]) / best(times[True]),
        "new_over_old_median": med(times[False]) / med(times[True]),
        "new_vs_copy_best": best(copy) / best(times[True]),
        "old_vs_copy_best": best(copy) / best(times[False]),
    }


def main(argv: list[str]) -> None:
    rows = []
    for kind in ("mla", "mha"):
        for name in ("torch", "ascend"):
            backend = sgl_core.get_backend(name)
            pairs = backend.supported_mha_pairs if kind == "mha" else backend.supported_pairs
            for layout, ios in dict(pairs).items():
                if layout.value == "layer_first":
                    continue
                for io in ios:
                    for page in (16, 64):
                        row = _row(kind, name, layout, io, page)
                        rows.append(row)
                        print(
                            f"{kind} {name} {row['layout']}/{row['io']} p{page}: new/old best "
                            f"{row['new_over_old_best']:.2f} median "
                            f"{row['new_over_old_median']:.2f}; vs copy new "
                            f"{row['new_vs_copy_best']:.2f} old {row['old_vs_copy_best']:.2f}",
                            flush=True,
                        )
    for choice in copy_calibration():
        if choice.key.startswith("stacked "):
            print(f"{choice.key} -> {choice.reason}")
    if argv:
        Path(argv[0]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
