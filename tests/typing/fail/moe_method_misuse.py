"""MoE method classes that do not satisfy ``sgl_core.MoEMethod``, and bad combine calls.

Every ``# E: <code>`` comment is an error mypy --strict must report on that line.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from sgl_core import MoEMethod, TorchMoEMethod, maybe_fuse_routed_scale_and_shared_add


class MissingApply:
    fuses_routed_scale_and_shared_add: ClassVar[bool] = True


class MissingCapability:
    def apply(
        self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return x


class InstanceCapability:
    """The capability must be declared on the class, not per instance."""

    def __init__(self) -> None:
        self.fuses_routed_scale_and_shared_add: bool = True

    def apply(
        self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return x


class StrCapability:
    fuses_routed_scale_and_shared_add: ClassVar[str] = "yes"

    def apply(
        self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return x


class NoTopkIds:
    fuses_routed_scale_and_shared_add: ClassVar[bool] = False

    def apply(self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        return x


class ReturnsTuple:
    fuses_routed_scale_and_shared_add: ClassVar[bool] = False

    def apply(
        self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


a: MoEMethod = MissingApply()  # E: assignment
b: MoEMethod = MissingCapability()  # E: assignment
c: MoEMethod = InstanceCapability()  # E: assignment
d: MoEMethod = StrCapability()  # E: assignment
e: MoEMethod = NoTopkIds()  # E: assignment
f: MoEMethod = ReturnsTuple()  # E: assignment
g: MoEMethod = TorchMoEMethod  # E: assignment


def combine(experts: object, routed: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    maybe_fuse_routed_scale_and_shared_add(experts, routed, shared, "2.5")  # E: arg-type
    maybe_fuse_routed_scale_and_shared_add(experts, routed, shared.numpy(), 2.5)  # E: arg-type
    out: tuple[torch.Tensor, torch.Tensor] = maybe_fuse_routed_scale_and_shared_add(experts, routed, None, 2.5)  # E: assignment
    return out[0]
