"""The order of a stacked backup's streaming table, measured alone (issue #27).

    python scripts/table_order_probe.py PAGE [ROUNDS]

Replays a ``page_first`` backup of the MLA shape (61 layers x 1152-byte rows, 4096 tokens,
a stacked device buffer of 2N tokens, a host of 4N, random pages on both sides) through
the streaming gather, with the table in item order (``slice_ops``) and in source order
(``slice_ops(..., by_source=True)``, what a backup builds), on 1 and 2 threads. Each round
evicts the caches before each call and divides the faster of a 1- and a 2-thread contiguous
``copy_`` of the same bytes by the call's time. Prints best-of and median per variant and
checks the bytes against numpy's run copies. Needs the streaming copy (x86-64 Linux).
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from sgl_core.transfer.copy._steps import copy_slices
from sgl_core.transfer.copy._stream import stream_copy, stream_copy_status, stream_each
from sgl_core.transfer.copy._stream_table import slice_ops

LAYERS, WORDS, TOKENS = 61, 144, 4096  # 144 int64 words: a 1152-byte MLA row


def main() -> None:
    if stream_copy() is None:
        sys.exit(f"streaming copy: {stream_copy_status()}")
    page = int(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    rng = np.random.default_rng(0)
    dev_pages, host_pages = 2 * TOKENS // page, 4 * TOKENS // page
    dev = rng.integers(0, 1 << 62, (LAYERS, dev_pages, page, WORDS), dtype=np.int64)
    host = np.zeros((host_pages, page, LAYERS, WORDS), dtype=np.int64)
    src = dev.transpose(1, 2, 0, 3)  # units (pages) along axis 0, as backup_slices sees them
    pairs = zip(rng.permutation(dev_pages), rng.permutation(host_pages), strict=False)
    runs = [(int(a), int(b), 1) for a, b in list(pairs)[: TOKENS // page]]
    tables = {"item": slice_ops(host, src, runs), "source": slice_ops(host, src, runs, True)}
    pool = ThreadPoolExecutor(1)
    scratch = np.ones(64 << 20, dtype=np.uint8)
    ref_src = torch.from_numpy(rng.integers(0, 255, TOKENS * LAYERS * 1152, dtype=np.uint8))
    ref_dst = torch.empty_like(ref_src)

    def evict() -> None:
        scratch[:] += 1

    def run(ops: np.ndarray[Any, Any], threads: int) -> None:
        if threads == 1:
            stream_each(ops)
            return
        half = ops.shape[0] // 2
        rest = pool.submit(stream_each, ops[half:])
        stream_each(ops[:half])
        rest.result()

    def reference() -> float:
        best = float("inf")
        for n in (1, 2):
            torch.set_num_threads(n)
            evict()
            t0 = time.perf_counter()
            ref_dst.copy_(ref_src)
            best = min(best, time.perf_counter() - t0)
        return best

    ratios: dict[str, list[float]] = {}
    for _ in range(rounds):
        ref = reference()
        for name, ops in tables.items():
            for threads in (1, 2):
                evict()
                t0 = time.perf_counter()
                run(ops, threads)
                ratios.setdefault(f"{name} order, {threads} thread(s)", []).append(
                    ref / (time.perf_counter() - t0)
                )
    want = np.zeros_like(host)
    copy_slices(want, src, runs)
    print(f"page {page}, {rounds} rounds, bit-exact: {np.array_equal(host, want)}")
    for name, got in ratios.items():
        print(f"  {name}: best {max(got):.2f}, median {statistics.median(got):.2f}")


if __name__ == "__main__":
    main()
