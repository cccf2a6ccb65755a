"""Which Python lines start OpenMP teams in a host pool's backup and per-layer load
(issue #27: beside a busy process each team waits for the busy core).

    cc -O2 -shared -fPIC scripts/omp_regions.c -o /tmp/libompregions.so -ldl
    LD_PRELOAD=/tmp/libompregions.so python scripts/omp_regions_probe.py \\
        [--backend torch|ascend] [--page-size 1,16,64] [--tokens 4096] [--layers 61]

Builds ``sgl-bench hicache``'s pools and indices (MLA shape, random host pages) per
layout and page size, warms them up (the copy calibration settles), then counts the
regions three backups and three loads of every layer start, attributed to the innermost Python
frames on the stack when the count moved. A calibrated choice of ATen's team (``0``,
``copy_blocks``) is expected: the busy-core check guards it. Anything else is a team
outside the copy.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import sys
import types
from typing import Any

import sgl_core
from sgl_core.cli._hicache import _Bench
from sgl_core.cli._hicache_plan import Case, HicacheConfig
from sgl_core.kv._enums import HostLayout, IOBackend

LAYOUTS = {
    "torch": (("layer_first", "direct"), ("page_first", "direct"), ("page_first_direct", "direct")),
    "ascend": (("page_first_kv_split", "kernel_ascend"),),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=sorted(LAYOUTS), default="torch")
    parser.add_argument("--page-size", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=61)
    args = parser.parse_args()
    try:
        count = ctypes.c_ulong.in_dll(ctypes.CDLL(None), "omp_regions")
    except ValueError:
        sys.exit("run under LD_PRELOAD of the library scripts/omp_regions.c builds")
    if args.backend == "ascend":
        import sgl_ascend  # only when asked for

        backend: Any = sgl_ascend.AscendBackend()
    else:
        backend = sgl_core.TorchBackend()
    hits: collections.Counter[str] = collections.Counter()
    last = [0]

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        now = count.value
        if now == last[0]:
            return
        where, f = [], frame
        while f is not None and len(where) < 4:
            where.append(f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}")
            f = f.f_back
        hits[" < ".join(where)] += now - last[0]
        last[0] = now

    cfg = HicacheConfig(shuffle_host=True, tokens=args.tokens, layers=args.layers)
    for layout, io in LAYOUTS[args.backend]:
        for page in (int(p) for p in args.page_size.split(",")):
            case = Case(backend, HostLayout(layout), IOBackend(io), page)
            bench = _Bench(case, cfg)
            for _ in range(8):  # the calibration settles
                bench.sgl_backup()
                bench.sgl_load()
            hits.clear()
            last[0] = count.value
            sys.setprofile(profile)
            for _ in range(3):
                bench.sgl_backup()
                bench.sgl_load()
            sys.setprofile(None)
            print(f"{layout} page {page}: {sum(hits.values())} regions in 3 backups + 3 loads")
            for where, n in hits.most_common(6):
                print(f"    {n:5d}  {where}")


if __name__ == "__main__":
    main()
