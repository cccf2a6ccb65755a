"""Ascend MHA / GQA host cache on CPU tensors: backup and per-layer load vs a plain copy.

A Llama-3-8B-shaped GQA cache (32 layers, 8 KV heads of 128, bf16: 128 KiB a
token) through ``sgl_ascend``'s ``AscendMHADevicePool`` / ``AscendMHAHostPool``
(``page_first_kv_split`` / ``kernel_ascend``). Device pages are a random
permutation (page 0 never used); host pages come from ``alloc()`` or, with
``--shuffle-host``, are random. One round trip is compared bit for bit first.
Then, interleaved: ``copy`` (one contiguous ``copy_`` of the batch's bytes),
``backup`` (one call, every layer) and ``load`` (``layer_num`` per-layer calls).
Prints best and median GB/s and the ratio to ``copy`` (median / median).

    python scripts/bench_ascend_mha.py [--tokens 512] [--rounds 5] [--shuffle-host] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import sgl_ascend
from sgl_core.testing import random_bits

LAYERS, HEADS, DIM = 32, 8, 128


def pages_of(page_list: torch.Tensor, page_size: int) -> torch.Tensor:
    return (page_list[:, None] * page_size + torch.arange(page_size)).reshape(-1)


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(page_size: int, tokens: int, rounds: int, shuffle_host: bool) -> None:
    gen = torch.Generator().manual_seed(page_size)
    backend = sgl_ascend.backend
    dev = backend.create_mha_device_pool(
        size=2 * tokens, page_size=page_size, dtype=torch.bfloat16, head_num=HEADS,
        head_dim=DIM, layer_num=LAYERS,
    )  # fmt: skip
    for buf in dev.components:
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))
    host = backend.create_host_pool(dev, layout="page_first_kv_split")
    n_pages = tokens // page_size
    perm = torch.randperm(dev.page_num - 1, generator=gen) + 1
    src, dst = pages_of(perm[:n_pages], page_size), pages_of(perm[n_pages : 2 * n_pages], page_size)
    if shuffle_host:
        h_pages = torch.randperm(host.page_num, generator=gen)[:n_pages]
        host_idx = pages_of(h_pages, page_size)
    else:
        alloc = host.alloc(tokens)
        assert alloc is not None
        host_idx = alloc
    io = "kernel_ascend"

    def backup() -> None:
        host.backup_from_device_all_layer(dev, host_idx, src, io)

    def load() -> None:
        for layer in range(LAYERS):
            host.load_to_device_per_layer(dev, host_idx, dst, layer, io)

    backup()
    load()
    want_k, want_v = dev.k_buffer[:, perm[:n_pages]], dev.v_buffer[:, perm[:n_pages]]
    got_k, got_v = (
        dev.k_buffer[:, perm[n_pages : 2 * n_pages]],
        dev.v_buffer[:, perm[n_pages : 2 * n_pages]],
    )
    if not (torch.equal(want_k.view(torch.int16), got_k.view(torch.int16))
            and torch.equal(want_v.view(torch.int16), got_v.view(torch.int16))):  # fmt: skip
        raise SystemExit(f"page {page_size}: round trip is not bit-exact")
    nbytes = tokens * dev.shape.layout_dim
    a = torch.empty(nbytes, dtype=torch.uint8)
    b = torch.empty_like(a)

    def copy() -> None:
        b.copy_(a)

    cases = {"copy": copy, "backup": backup, "load": load}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(rounds + 1):
        for name, fn in cases.items():
            t = timed(fn)
            if i:  # round 0 warms up
                times[name].append(t)
    gbs = {name: [nbytes / t / 1e9 for t in ts] for name, ts in times.items()}
    copy_med = statistics.median(gbs["copy"])
    for name in cases:
        best, med = max(gbs[name]), statistics.median(gbs[name])
        print(
            f"page {page_size:4d}  {name:6s}  best {best:6.2f} GB/s  median {med:6.2f} GB/s  "
            f"ratio {med / copy_med:5.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shuffle-host", action="store_true")
    parser.add_argument("--page-sizes", default="16,64,128")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    mib = args.tokens * LAYERS * HEADS * DIM * 2 * 2 / 2**20
    print(
        f"{args.tokens} tokens, {mib:.0f} MiB a batch, shuffle_host={args.shuffle_host}, "
        f"threads={torch.get_num_threads()}"
    )
    for page_size in (int(p) for p in args.page_sizes.split(",")):
        run(page_size, args.tokens, args.rounds, args.shuffle_host)


if __name__ == "__main__":
    main()
