"""The streaming copy's AVX2 kernel of two trees in one process (issue #27, tenth session);
not shipped code.

Maps each tree's ``_stream_code.AVX2`` (read from its source file, so the trees need not
be importable side by side) and replays one whole per-layer hicache load of the MLA shape
with each, as ``scripts/nt_gather_probe.py`` builds it (61 layers x 1152-byte rows, 4096
tokens a call, random pages), on one thread and on two (halves, the second on a helper
thread), rounds interleaved with the order reversed every other round and the caches
evicted before each load. Prints best-of / median GB/s per tree and thread count; checks
both trees' results bit-exact against each other first.

    PYTHONPATH=packages/core/src python scripts/kernel_ab_probe.py OLD_TREE NEW_TREE \\
        [--page 16] [--layout page_first] [--rounds 9]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nt_gather_probe as probe  # a sibling script, not a package

_CODE = "packages/core/src/sgl_core/transfer/copy/_stream_code.py"


def _kernel(tree: str) -> probe.Kernel:
    spec = importlib.util.spec_from_file_location(f"_code_{abs(hash(tree))}", Path(tree) / _CODE)
    if spec is None or spec.loader is None:
        sys.exit(f"no {_CODE} under {tree}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel: probe.Kernel = module.AVX2
    return kernel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--layout", default="page_first",
                    choices=["layer_first", "page_first", "page_first_direct"])  # fmt: skip
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if "avx2" not in probe.cpu_flags():
        sys.exit("this CPU does not run avx2")
    gathers = {side: probe.load_gather(_kernel(tree)) for side, tree in
               (("old", args.old), ("new", args.new))}  # fmt: skip
    torch.manual_seed(0)
    dev = torch.ones(probe.LAYERS, 2 * probe.TOKENS * probe.ROW, dtype=torch.uint8)
    host = torch.randint(0, 256, (4 * probe.TOKENS * probe.LAYERS * probe.ROW,), dtype=torch.uint8)
    layers = probe.layer_ops(args.page, args.layout, dev.data_ptr(), host.data_ptr())
    tables = probe.tables_of(layers)
    helpers = {side: probe.Helper(g) for side, g in gathers.items()}
    fns: dict[str, Callable[[], None]] = {}
    for side, gather in gathers.items():
        fns[f"{side} 1 thread"] = functools.partial(probe.on_one, tables, gather)
        fns[f"{side} 2 threads"] = functools.partial(probe.on_two, tables, gather, helpers[side])
    results = []
    for side in gathers:
        dev.zero_()
        fns[f"{side} 2 threads"]()
        results.append(dev.clone())
    if not torch.equal(results[0], results[1]):
        sys.exit("the two kernels' loads differ")
    scratch = torch.empty(64 << 20, dtype=torch.uint8)
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            scratch.fill_(r)  # evict the caches
            start = time.perf_counter()
            fns[name]()
            if r:
                times[name].append(time.perf_counter() - start)
    nbytes = probe.TOKENS * probe.LAYERS * probe.ROW
    print(f"{args.layout} page {args.page}, GB/s best / median:")
    for name, ts in times.items():
        best, mid = nbytes / min(ts) / 1e9, nbytes / statistics.median(ts) / 1e9
        print(f"  {name}: {best:.1f} / {mid:.1f}")


if __name__ == "__main__":
    main()
