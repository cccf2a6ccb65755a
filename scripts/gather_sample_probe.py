"""Reproduce BENCHMARKS.md's page-1 gather figures (issue #27): the calibrator's sample
against the whole call; not shipped code.

A page-1 backup gathers 4096 random 1152-byte rows of each of 61 layers (288 MB) with the
streaming copy (``gather_streams``). The calibrator times its candidates on segments of
the first layer's rows; this script times ``stream1`` and ``stream2`` on such segments
(900 rows, about 1 MiB, and 3600 rows, about 4 MiB), warm and after ``evict_caches``, and
on the whole call, each the median of several calls, and checks the rows bit-exact.

    python scripts/gather_sample_probe.py [repeats]

x86-64 Linux with the streaming copy loaded (``stream_copy_status()`` says why not).
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable

import torch

from sgl_core.kv._memory import cpu_zeros
from sgl_core.transfer.copy._evict import evict_caches
from sgl_core.transfer.copy._stream import stream_copy_status
from sgl_core.transfer.copy._stream_gather import gather_streams

LAYERS, DST_ROWS, SRC_ROWS, ROWS = 61, 16384, 8192, 4096


def _median_ms(fn: Callable[[], None], cold: bool, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if cold:
            evict_caches()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(repeats: int) -> int:
    gen = torch.Generator().manual_seed(0)
    dst = [cpu_zeros((DST_ROWS, 576), torch.bfloat16, "cpu") for _ in range(LAYERS)]
    src = [cpu_zeros((SRC_ROWS, 576), torch.bfloat16, "cpu") for _ in range(LAYERS)]
    for s in src:
        s.view(torch.int16).copy_(torch.randint(-(1 << 15), 1 << 15, s.shape, generator=gen))
    d_idx = torch.randperm(DST_ROWS, generator=gen)[:ROWS]
    s_idx = torch.randperm(SRC_ROWS, generator=gen)[:ROWS]
    streams = gather_streams(dst, src, d_idx, s_idx)
    if streams is None:
        print(f"no streaming copy here: {stream_copy_status()}")
        return 2
    run, full = streams
    for cold in (False, True):
        row = {}
        for rows in (900, 3600):
            for n in (1, 2):
                part = functools.partial(run, n, 0, rows)
                row[f"{rows} rows, stream{n}"] = _median_ms(part, cold, repeats)
        for n in (1, 2):
            whole = functools.partial(full, n)
            row[f"whole call, stream{n}"] = _median_ms(whole, cold, max(3, repeats // 2))
        print("cold" if cold else "warm", ", ".join(f"{k}: {v:.3f} ms" for k, v in row.items()))
    exact = all(
        torch.equal(d.view(torch.int16)[d_idx], s.view(torch.int16)[s_idx])
        for d, s in zip(dst, src, strict=True)
    )
    print("bit-exact:", "yes" if exact else "NO")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 9))
