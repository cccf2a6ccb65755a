"""MoE methods from device packages, offered to ``sgl-bench moe`` by the entry-point group
``sgl.moe_bench_cases`` (docs/design.md section 4): sgl_core never imports a device package
by name. The bench calls each registered factory and checks the case it returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import torch

from sgl_core.kv.protocols._protocols import MoEMethod
from sgl_core.moe._moe import MoEWeights

__all__ = ["MOE_BENCH_GROUP", "MoEBenchCase", "MoEBenchFactory", "moe_bench_factories"]

MOE_BENCH_GROUP = "sgl.moe_bench_cases"


@dataclasses.dataclass(frozen=True)
class MoEBenchCase:
    """One MoE method on one layer's weights, with the dense weights it stands for.

    ``reference`` holds what ``layer`` encodes (dequantized, float32), so the
    bench can check ``method.apply(layer, ...)`` against float64 math and time
    it against the torch reference method on the same dense weights.
    """

    name: str
    method: MoEMethod
    layer: Any
    reference: MoEWeights
    note: str = ""
    #: Largest accepted max-abs error relative to the output's max magnitude.
    tolerance: float = 3e-2


#: ``factory(device, small)``: raise ``sgl_core.errors.BackendUnavailableError``
#: when the method cannot run on ``device`` here.
MoEBenchFactory = Callable[[torch.device, bool], MoEBenchCase]


def moe_bench_factories() -> dict[str, MoEBenchFactory]:
    """Registered factories by entry-point name (loading imports their packages)."""
    return {ep.name: ep.load() for ep in entry_points(group=MOE_BENCH_GROUP)}
