"""Every copy path of the token-row host pool passes the conformance suite.

The host pool picks a path by block size (all-layer strided copies, copies by
address, per-layer gather/scatter, per-block slice copies); the suite's small
pools would only ever reach some of them. Each class here pins one choice by
building its backend with a ``CopyTuning``, and runs the whole suite, on device
pools with the layers in one allocation and in one allocation per layer. The
kinds: split MLA rows and MHA with equal and narrower V (the separate-layer
classes: MLA only, the pools they change); packed rows and the indexer run
in ``test_conformance_torch``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core.backend import NEVER, Backend, CopyTuning, MLADevicePool
from sgl_core.testing import KINDS, BackendConformanceSuite, KindCase


def kinds_named(*names: str) -> tuple[KindCase, ...]:
    return tuple(k for k in KINDS if k.name in names)


class SeparateLayers(sgl_core.backend.PerLayerMLADevicePool):
    layers_in_one_allocation = False


class _PinnedPath(BackendConformanceSuite):
    backend_name = "torch"
    kinds = kinds_named("mla", "mha", "mha_narrow_v")
    tuning: ClassVar[CopyTuning] = CopyTuning()
    separate_layers = False

    @pytest.fixture
    def backend(self) -> Backend:
        return sgl_core.TorchBackend(tuning=self.tuning)

    def make_device_pool(
        self, backend: Backend, *, page_size: int, pages: int, **options: Any
    ) -> MLADevicePool:
        if not self.separate_layers:
            return super().make_device_pool(backend, page_size=page_size, pages=pages, **options)
        args = self.device_pool_args(**options)
        return SeparateLayers(size=pages * page_size, page_size=page_size, **args)


_BY_ADDRESS = CopyTuning(stacked_min_run_bytes=NEVER, by_address_min_block_bytes=0)
_GATHER = CopyTuning(
    stacked_min_run_bytes=NEVER, by_address_min_block_bytes=NEVER, gather_below_run_bytes=NEVER
)
_SLICES = CopyTuning(
    stacked_min_run_bytes=NEVER, by_address_min_block_bytes=NEVER, gather_below_run_bytes=0
)
_STACKED = CopyTuning(stacked_min_run_bytes=0)


class TestByAddress(_PinnedPath):
    tuning = _BY_ADDRESS


class TestByAddressSeparateLayers(_PinnedPath):
    kinds = kinds_named("mla")
    tuning = _BY_ADDRESS
    separate_layers = True


class TestGatherScatter(_PinnedPath):
    tuning = _GATHER


class TestSliceBlocks(_PinnedPath):
    tuning = _SLICES


class TestSliceBlocksSeparateLayers(_PinnedPath):
    kinds = kinds_named("mla")
    tuning = _SLICES
    separate_layers = True


class TestStackedAllLayers(_PinnedPath):
    tuning = _STACKED


def test_each_tuning_takes_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuning objects above really select different copy paths."""
    from sgl_core.testing import page_indices
    from sgl_core.transfer.copy import _steps

    seen: list[str] = []
    for name in ("memmove_each", "gather_chunks", "take_rows", "copy_slices"):
        real = getattr(_steps, name)

        def spy(*args: object, _real: object = real, _name: str = name) -> None:
            seen.append(_name)
            _real(*args)  # type: ignore[operator]

        monkeypatch.setattr(_steps, name, spy)
    paths = {}
    for label, tuning in (("by_address", _BY_ADDRESS), ("gather", _GATHER), ("slices", _SLICES)):
        backend = sgl_core.TorchBackend(tuning=tuning)
        dev = backend.create_device_pool(
            size=64, page_size=16, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=8,
            layer_num=2,
        )  # fmt: skip
        host = backend.create_host_pool(dev, layout="layer_first")
        idx = page_indices([2, 0], 16)
        seen.clear()
        host.load_to_device_per_layer(dev, idx, idx, 0, "direct")
        paths[label] = tuple(seen)
    assert paths == {
        "by_address": ("memmove_each",),
        "gather": ("take_rows",),
        "slices": ("copy_slices",),
    }
