"""Benchmark kernel_ascend backup/load against a contiguous copy and a per-page loop.

DeepSeek-V3 shape by default (61 layers, kv_lora_rank 512 + rope 64, bf16,
page 64). For each page pattern (one contiguous run; shuffled pages, every
page its own run) it times, interleaved round by round, and reports medians:

* ``contiguous``: one ``dst.copy_(src)`` of the same number of bytes (the target);
* ``backup``: ``backup_from_device_all_layer`` (all layers, k and v);
* ``load``: ``load_to_device_per_layer`` for every layer in turn (same bytes);
* ``loop backup`` / ``loop load``: a Python loop per page (and per layer for
  load) doing one slice copy per component: the baseline the batching replaces.

Run: ``python packages/ascend/benchmarks/bench_kernel_ascend.py [--pages 32]``.
On a CPU-only machine "device" tensors are CPU tensors, so this measures the
copy planning and host memory bandwidth, not an NPU's DMA engines.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch

import sgl_ascend
from sgl_ascend import AscendMLADevicePool, AscendMLAHostPool


def page_tokens(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    return (pages[:, None] * page_size + torch.arange(page_size)).flatten()


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


def backup(
    host: AscendMLAHostPool, dev: AscendMLADevicePool, h_idx: torch.Tensor, d_idx: torch.Tensor
) -> None:
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "kernel_ascend")


def load_all(
    host: AscendMLAHostPool, dev: AscendMLADevicePool, h_idx: torch.Tensor, d_idx: torch.Tensor
) -> None:
    for layer in range(dev.layer_num):
        host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "kernel_ascend")


def load_one(
    host: AscendMLAHostPool, dev: AscendMLADevicePool, h_idx: torch.Tensor, d_idx: torch.Tensor
) -> None:
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "kernel_ascend")


def loop_backup(
    host: AscendMLAHostPool, dev: AscendMLADevicePool, hp: list[int], dp: list[int]
) -> None:
    for h, d in zip(hp, dp, strict=True):
        host.k_buffer[h].copy_(dev.k_buffer[:, d])
        host.v_buffer[h].copy_(dev.v_buffer[:, d])


def loop_load(
    host: AscendMLAHostPool, dev: AscendMLADevicePool, hp: list[int], dp: list[int]
) -> None:
    for layer in range(dev.layer_num):
        for h, d in zip(hp, dp, strict=True):
            dev.k_buffer[layer, d].copy_(host.k_buffer[h, layer])
            dev.v_buffer[layer, d].copy_(host.v_buffer[h, layer])


def run(args: argparse.Namespace) -> None:
    ps = args.page_size
    dev = sgl_ascend.backend.create_device_pool(
        size=args.device_pages * ps,
        page_size=ps,
        dtype=torch.bfloat16,
        kv_lora_rank=args.kv_lora_rank,
        qk_rope_head_dim=args.rope,
        layer_num=args.layers,
    )
    host = sgl_ascend.backend.create_host_pool(
        dev, layout="page_first_kv_split", host_to_device_ratio=2.0
    )
    dev.k_buffer.normal_()
    dev.v_buffer.normal_()
    nbytes = args.pages * ps * dev.kv_cache_dim * args.layers * 2
    src = torch.randn(nbytes // 2).bfloat16()
    dst = torch.empty_like(src)
    gen = torch.Generator().manual_seed(0)
    patterns = {
        "one run": (torch.arange(args.pages) + 3, torch.arange(args.pages) + 1),
        "shuffled": (
            torch.randperm(host.page_num, generator=gen)[: args.pages],
            torch.randperm(dev.page_num, generator=gen)[: args.pages],
        ),
    }
    print(
        f"{args.layers} layers, {args.kv_lora_rank}+{args.rope} bf16, page {ps}, "
        f"{args.pages} pages = {nbytes / 1e6:.1f} MB per transfer, "
        f"{torch.get_num_threads()} torch threads, {args.repeats} rounds (medians)"
    )
    for name, (hp, dp) in patterns.items():
        h_idx, d_idx = page_tokens(hp, ps), page_tokens(dp, ps)
        hl, dl = hp.tolist(), dp.tolist()

        cases: dict[str, Callable[[], None]] = {
            "contiguous": functools.partial(copy, dst, src),
            "backup": functools.partial(backup, host, dev, h_idx, d_idx),
            "load": functools.partial(load_all, host, dev, h_idx, d_idx),
            "loop backup": functools.partial(loop_backup, host, dev, hl, dl),
            "loop load": functools.partial(loop_load, host, dev, hl, dl),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        for fn in cases.values():  # warm-up
            fn()
        for _ in range(args.repeats):
            for key, fn in cases.items():
                times[key].append(timed(fn))
        base = statistics.median(times["contiguous"])
        one = functools.partial(load_one, host, dev, h_idx[:ps], d_idx[:ps])
        call_us = statistics.median(timed(one) for _ in range(200)) * 1e6
        print(f"\n[{name}]  (fixed cost of one 1-page load call: {call_us:.0f} us)")
        for key, samples in times.items():
            med = statistics.median(samples)
            print(f"  {key:12s} {nbytes / med / 1e9:7.2f} GB/s  {base / med:5.2f}x contiguous")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=32, help="pages per transfer")
    parser.add_argument("--device-pages", type=int, default=48)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--kv-lora-rank", type=int, default=512)
    parser.add_argument("--rope", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args)


if __name__ == "__main__":
    main()
