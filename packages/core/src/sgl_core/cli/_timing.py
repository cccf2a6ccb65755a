"""Interleaved, median-based timing of a set of operations."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

import torch

__all__ = ["median", "sync", "time_interleaved"]

K = TypeVar("K", bound=Hashable)


def sync(device: torch.device) -> None:
    """Wait for queued work on ``device`` (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(samples: list[float]) -> float:
    return float(statistics.median(samples)) if samples else float("nan")


def time_interleaved(
    ops: Mapping[K, Callable[[], None]],
    *,
    warmup: int,
    repeats: int,
    budget_s: float,
    device: torch.device,
    on_step: Callable[[], None] | None = None,
    prepare: Mapping[K, Callable[[], None]] | None = None,
) -> dict[K, list[float]]:
    """Seconds per call of every op, measured round-robin.

    Each round runs every op once, so slow drifts of the machine (other
    processes, frequency, page cache) hit all ops alike. The first ``warmup``
    rounds are not recorded. An op that has spent more than ``budget_s`` and
    has one recorded sample sits out later rounds (slow baselines).
    ``prepare[key]``, if given, runs untimed before each call of ``ops[key]``
    (e.g. to restore inputs an in-place op consumed).
    """
    samples: dict[K, list[float]] = {key: [] for key in ops}
    spent: dict[K, float] = dict.fromkeys(ops, 0.0)
    for round_no in range(warmup + repeats):
        for key, fn in ops.items():
            if round_no > warmup and samples[key] and spent[key] > budget_s:
                continue
            if prepare is not None and key in prepare:
                prepare[key]()
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            elapsed = time.perf_counter() - start
            spent[key] += elapsed
            if round_no >= warmup:
                samples[key].append(elapsed)
        if on_step is not None:
            on_step()
    return samples
