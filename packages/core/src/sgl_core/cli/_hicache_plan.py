"""``sgl-bench hicache`` before any work: model shapes, the run's configuration and cases.

Model shapes are each model's KV cache per tensor-parallel rank of 1 (all KV
heads on one device); MHA rows have V as wide as K, MLA rows are
``--kv-lora-rank`` + ``--rope-dim`` (hidden options, 512 + 64) or packed.
Everything a run could fail on for a bad argument is decided here (exit 2,
one line), so a long run never ends in an error it could have reported at
the start: device names, sizes that cannot fit in memory, output paths,
``--plot`` without matplotlib, a layout no selected backend builds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import torch

from sgl_core.backends._discovery import available_backends, get_backend
from sgl_core.cli._checks import UsageError, check_args, check_memory
from sgl_core.errors import BackendUnavailableError
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.protocols._protocols import Backend, EmulatedWithoutDevice

__all__ = ["MODELS", "Case", "HicacheConfig", "Plan", "create_device_pool", "plan_run"]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    head_num: int = 0  # MHA: KV heads
    head_dim: int = 0  # MHA
    dtype: torch.dtype = torch.bfloat16
    kv_cache_dim: int | None = None  # MLA packed rows of ``dtype``
    index_head_dim: int | None = None  # the DSA indexer cache, on every layer
    with_index_k_scale: bool = False

    @property
    def is_mha(self) -> bool:
        return self.head_num > 0


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("deepseek-v3", 61),
        # FP8 MLA rows (512 fp8 + 4 fp32 scales + 64 bf16 rope = 656 bytes) and the DSA
        # indexer cache (128 fp8 bytes + an fp32 scale per token) on every layer.
        ModelShape(
            "deepseek-v32",
            61,
            dtype=torch.uint8,
            kv_cache_dim=656,
            index_head_dim=128,
            with_index_k_scale=True,
        ),
        ModelShape("llama3-70b", 80, head_num=8, head_dim=128),
        ModelShape("qwen3-235b", 94, head_num=4, head_dim=128),
    )
}


def create_device_pool(backend: Backend, cfg: HicacheConfig, *, size: int, page_size: int) -> Any:
    """A device pool of the model's kind (MLA dims may be overridden by hidden options).

    Typed ``Any``: the bench drives pools of either kind through the same calls.
    """
    shape = cfg.shape
    common: dict[str, Any] = {"size": size, "page_size": page_size, "dtype": shape.dtype}
    common.update(layer_num=cfg.layers, device=cfg.device)
    if shape.is_mha:
        return backend.create_mha_device_pool(
            **common, head_num=shape.head_num, head_dim=shape.head_dim
        )
    return backend.create_device_pool(
        **common,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        kv_cache_dim=shape.kv_cache_dim,
        index_head_dim=shape.index_head_dim,
        with_index_k_scale=shape.with_index_k_scale,
    )


@dataclasses.dataclass(frozen=True)
class HicacheConfig:
    """Model shape and run size (defaults: DeepSeek-V3 MLA cache in bf16)."""

    layers: int = 61
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    tokens: int = 4096  # tokens moved per call, unless ``pages`` is given
    pages: int | None = None  # pages moved per call
    warmup: int = 1
    repeats: int = 5
    budget_s: float = 4.0  # per op: slow baselines stop repeating after this
    baselines: tuple[str, ...] = ("per_token", "per_page")
    shuffle_host: bool = False  # random host pages instead of host.alloc() slots
    seed: int = 0
    device: str | None = None
    # a key of MODELS, which gives dtype, packed rows and indexer; MHA ignores the MLA dims
    model: str = "deepseek-v3"
    compare_fixed: bool = False  # also time "fixed": the old preset (ATen's threads), interleaved
    copy_threads: tuple[int, ...] = (1,)  # the reference: the fastest of these torch thread counts

    @property
    def shape(self) -> ModelShape:
        return MODELS[self.model]

    @property
    def row_bytes(self) -> int:
        """Bytes of one token over every layer (MLA row or K and V, indexer included)."""
        shape = self.shape
        itemsize = torch.empty((), dtype=shape.dtype).element_size()
        if shape.is_mha:
            return self.layers * 2 * shape.head_num * shape.head_dim * itemsize
        dim = shape.kv_cache_dim or self.kv_lora_rank + self.qk_rope_head_dim
        index = (shape.index_head_dim or 0) * itemsize + (4 if shape.with_index_k_scale else 0)
        return self.layers * (dim * itemsize + index)

    def batch_tokens(self, page_size: int) -> int:
        if self.pages is not None:
            return self.pages * page_size
        return max(page_size, self.tokens // page_size * page_size)


@dataclasses.dataclass(frozen=True)
class Case:
    backend: Backend
    layout: HostLayout
    io_backend: IOBackend
    page_size: int

    @property
    def label(self) -> str:
        return (
            f"{self.backend.name} {self.layout.value}/{self.io_backend.value} page {self.page_size}"
        )


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
        name = backend.name
        if not backend.is_available():
            if not isinstance(backend, EmulatedWithoutDevice):
                notes.append(f"backend {name!r}: its device is not available; CPU tensors")
            elif spec_all:  # left out: an emulator measures nothing about the device
                notes.append(
                    f"backend {name!r} left out: {backend.missing_device()}; "
                    f"`sgl-bench hicache --backend {name}` runs it emulated (correctness only)"
                )
                continue
            else:  # named explicitly: the backend turns its emulator on for this process
                try:
                    notes.append(f"backend {name!r}: {backend.start_emulation()}")
                except BackendUnavailableError as exc:
                    raise UsageError(f"backend {name!r}: {exc}") from None
                interpreted.add(name)
        chosen.append(backend)
    return chosen, interpreted


def plan_run(args: argparse.Namespace) -> Plan:
    """Check every argument and resolve the run; ``UsageError`` before any work."""
    positive = ("pages", "layers", "tokens", "repeats", "budget", "kv_lora_rank", "rope_dim")
    device = check_args(args, positive, nonneg=("warmup", "background_load"))
    most = 4 * (os.cpu_count() or 1)
    if args.background_load > most:
        raise UsageError(
            f"--background-load must be at most {most} (4 per CPU), got {args.background_load}"
        )
    notes: list[str] = []
    backends, interpreted = select_backends(args.backend or ("all" if args.full else None), notes)
    shrink = bool(interpreted)
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
    if shrink and (cfg.layers, cfg.tokens) == INTERPRETED_SIZE and args.pages is None:
        notes.append(
            f"Triton interpreter: the run is shrunk to {cfg.layers} layers x {cfg.tokens} "
            f"tokens, {cfg.repeats} timed repeat (--layers/--tokens/--pages override)"
        )
    mha = cfg.shape.is_mha  # the (layout, io) pairs each backend builds for the pool kind
    pairs = [(b, b.supported_mha_pairs if mha else b.supported_pairs) for b in backends]
    cases = [
        Case(backend, layout, io, page_size)
        for backend, built in pairs
        for page_size in page_sizes
        for layout, ios in built.items()
        if args.layout is None or layout in args.layout
        for io in sorted(ios, key=lambda i: i.value)
    ]
    if not cases:
        built = "; ".join(f"{b.name}: {', '.join(x.value for x in p)}" for b, p in pairs)
        raise UsageError(f"no selected backend builds the --layout given (layouts: {built})")
    # the largest case fits: device pool 2x the batch, host pool 4x, two copy buffers 1x
    row, worst = cfg.row_bytes, 0
    for case in cases:
        n = cfg.batch_tokens(case.page_size)
        on_device = (2 * n + case.page_size) * row + n * row
        if device is not None:
            on_host = device.type == "cpu"
        else:
            on_host = case.backend.name == "torch" or not case.backend.is_available()
        worst = max(worst, 5 * n * row + (on_device if on_host else 0))
    option = "--pages" if cfg.pages is not None else "--tokens/--page-size"
    check_memory(option, worst, "the largest case (pools and copy buffers)")
    return Plan(cfg, cases, page_sizes, quick, notes, interpreted)
