"""``sgl-bench hicache`` before any work: arguments checked, backends and run size chosen.

Everything a run could fail on for a bad argument is decided here (exit 2,
one line), so a long run never ends in an error it could have reported at
the start: device names, sizes that cannot fit in memory, output paths,
``--plot`` without matplotlib, a layout no selected backend builds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from sgl_core.backends._discovery import available_backends, get_backend
from sgl_core.cli._checks import UsageError, check_args, check_memory
from sgl_core.cli._hicache_models import MODELS, Case, HicacheConfig, list_cases, pairs_of
from sgl_core.errors import BackendUnavailableError
from sgl_core.kv.protocols._protocols import Backend, EmulatedWithoutDevice

__all__ = ["FULL_PAGE_SIZES", "INTERPRETED_SIZE", "Plan", "plan_run"]

FULL_PAGE_SIZES = [1, 16, 64, 128]
# Under Triton's interpreter a kernel runs as numpy calls per program: the run
# shrinks to this (layers, tokens) unless --layers/--tokens/--pages are given.
INTERPRETED_SIZE = (4, 256)


@dataclasses.dataclass
class Plan:
    """What a checked ``hicache`` run will do."""

    cfg: HicacheConfig
    cases: list[Case]
    page_sizes: list[int]
    quick: bool
    notes: list[str]
    interpreted: set[str]  # backends whose kernels run in Triton's interpreter


def _emulated(backend: EmulatedWithoutDevice, name: str, spec_all: bool, notes: list[str]) -> bool:
    """Decide how a backend that only emulates without its device runs; False: leave it out.

    Named explicitly, it runs emulated (the backend turns its emulator on for
    this process); with ``--backend all`` it is left out (an emulator measures
    nothing about the device).
    """
    if spec_all:
        notes.append(
            f"backend {name!r} left out: {backend.missing_device()}; "
            f"`sgl-bench hicache --backend {name}` runs it emulated (correctness only)"
        )
        return False
    try:
        how = backend.start_emulation()
    except BackendUnavailableError as exc:
        raise UsageError(f"backend {name!r}: {exc}") from None
    notes.append(f"backend {name!r}: {how}")
    return True


def select_backends(spec: str | None, notes: list[str]) -> tuple[list[Backend], set[str]]:
    """Backends to run, and which of them run in Triton's interpreter."""
    if spec is None:
        return [get_backend()], set()
    spec_all = spec.strip().lower() == "all"
    names = available_backends() if spec_all else [n for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError(f"--backend {spec!r} names no backend")
    chosen: list[Backend] = []
    interpreted: set[str] = set()
    for raw in names:
        backend = get_backend(raw.strip())
        if backend in chosen:
            continue
        if not backend.is_available():
            if isinstance(backend, EmulatedWithoutDevice):
                if not _emulated(backend, backend.name, spec_all, notes):
                    continue
                interpreted.add(backend.name)
            else:
                notes.append(f"backend {backend.name!r}: its device is not available; CPU tensors")
        chosen.append(backend)
    return chosen, interpreted


def _check_args(args: argparse.Namespace) -> torch.device | None:
    positive = ("pages", "layers", "tokens", "repeats", "budget", "kv_lora_rank", "rope_dim")
    device = check_args(args, positive, nonneg=("warmup", "background_load"))
    most = 4 * (os.cpu_count() or 1)
    if args.background_load > most:
        raise UsageError(
            f"--background-load must be at most {most} (4 per CPU), got {args.background_load}"
        )
    return device


def _config(args: argparse.Namespace, shrink: bool) -> tuple[HicacheConfig, list[int], bool]:
    quick = not args.full  # a selection (--backend/--layout/--page-size) narrows the quick run
    page_sizes = args.page_size or (FULL_PAGE_SIZES if args.full else [64])
    sized = args.layers is not None or args.tokens is not None or args.pages is not None
    model = MODELS[args.model]
    layers, tokens = (
        INTERPRETED_SIZE if shrink and not sized else (model.layers, 2048 if quick else 4096)
    )
    warmup_default = 0 if shrink else 1
    cfg = HicacheConfig(
        layers=args.layers or layers,
        kv_lora_rank=args.kv_lora_rank,
        qk_rope_head_dim=args.rope_dim,
        tokens=args.tokens or tokens,
        pages=args.pages,
        warmup=warmup_default if args.warmup is None else args.warmup,
        repeats=args.repeats or (1 if shrink else 3 if quick else 5),
        budget_s=args.budget or (1.0 if quick or shrink else 4.0),
        baselines=() if args.no_baselines else ("per_token", "per_page"),
        shuffle_host=args.shuffle_host,
        device=args.device,
        model=model.name,
        compare_fixed=args.compare_fixed,
        copy_threads=tuple(sorted({1, torch.get_num_threads()})),
    )
    return cfg, page_sizes, quick


def _device_on_host(backend: Backend, device: torch.device | None) -> bool:
    if device is not None:
        return device.type == "cpu"
    return backend.name == "torch" or not backend.is_available()


def _check_memory(cfg: HicacheConfig, plan_cases: list[Case], device: torch.device | None) -> None:
    """The largest case fits: device pool 2x the batch, host pool 4x, two copy buffers 1x."""
    row = cfg.row_bytes
    worst = 0
    for case in plan_cases:
        n = cfg.batch_tokens(case.page_size)
        on_device = (2 * n + case.page_size) * row + n * row
        host = 5 * n * row + (on_device if _device_on_host(case.backend, device) else 0)
        worst = max(worst, host)
    option = "--pages" if cfg.pages is not None else "--tokens/--page-size"
    check_memory(option, worst, "the largest case (pools and copy buffers)")


def plan_run(args: argparse.Namespace) -> Plan:
    """Check every argument and resolve the run; ``UsageError`` before any work."""
    device = _check_args(args)
    notes: list[str] = []
    backends, interpreted = select_backends(args.backend or ("all" if args.full else None), notes)
    cfg, page_sizes, quick = _config(args, shrink=bool(interpreted))
    if interpreted and (cfg.layers, cfg.tokens) == INTERPRETED_SIZE and args.pages is None:
        notes.append(
            f"Triton interpreter: the run is shrunk to {cfg.layers} layers x {cfg.tokens} "
            f"tokens, {cfg.repeats} timed repeat (--layers/--tokens/--pages override)"
        )
    cases = list_cases(backends, args.layout, page_sizes, mha=cfg.shape.is_mha)
    if not cases:
        built = "; ".join(
            f"{b.name}: {', '.join(layout.value for layout in pairs_of(b, cfg.shape.is_mha))}"
            for b in backends
        )
        raise UsageError(f"no selected backend builds the --layout given (layouts: {built})")
    _check_memory(cfg, cases, device)
    return Plan(cfg, cases, page_sizes, quick, notes, interpreted)
