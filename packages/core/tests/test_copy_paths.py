"""Every copy path of the token-row host pool passes the conformance suite.

The host pool picks a path by block size (all-layer strided copies, copies by
address, per-layer gather/scatter, per-block slice copies); the suite's small
pools would only ever reach some of them. Each class here pins one choice by
moving the size thresholds, and runs the whole suite, on device pools with the
layers in one allocation and in one allocation per layer.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

import sgl_core
from sgl_core import _row_mover
from sgl_core._protocols import Backend, MLADevicePool
from sgl_core.testing import BackendConformanceSuite

NEVER = 1 << 62


class SeparateLayers(sgl_core.PerLayerMLADevicePool):
    layers_in_one_allocation = False


class _PinnedPath(BackendConformanceSuite):
    backend_name = "torch"
    thresholds: ClassVar[dict[str, int]] = {}
    separate_layers = False

    @pytest.fixture(autouse=True)
    def _pin_path(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, value in self.thresholds.items():
            monkeypatch.setattr(_row_mover, name, value)

    def make_device_pool(self, backend: Backend, *, page_size: int, pages: int) -> MLADevicePool:
        if not self.separate_layers:
            return super().make_device_pool(backend, page_size=page_size, pages=pages)
        return SeparateLayers(
            size=pages * page_size,
            page_size=page_size,
            dtype=self.dtype,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            layer_num=self.layer_num,
        )


_BY_ADDRESS = {"_STACKED_MIN_RUN_BYTES": NEVER, "_MEMMOVE_MIN_BLOCK_BYTES": 0}
_GATHER = {"_STACKED_MIN_RUN_BYTES": NEVER, "_MEMMOVE_MIN_BLOCK_BYTES": NEVER}
_SLICES = {
    "_STACKED_MIN_RUN_BYTES": NEVER,
    "_MEMMOVE_MIN_BLOCK_BYTES": NEVER,
    "_SHORT_RUN_BYTES": 0,
}
_STACKED = {"_STACKED_MIN_RUN_BYTES": 0}


class TestByAddress(_PinnedPath):
    thresholds = _BY_ADDRESS


class TestByAddressSeparateLayers(_PinnedPath):
    thresholds = _BY_ADDRESS
    separate_layers = True


class TestGatherScatter(_PinnedPath):
    thresholds = _GATHER


class TestSliceBlocks(_PinnedPath):
    thresholds = _SLICES


class TestSliceBlocksSeparateLayers(_PinnedPath):
    thresholds = _SLICES
    separate_layers = True


class TestStackedAllLayers(_PinnedPath):
    thresholds = _STACKED


def test_paths_are_pinned_by_these_names() -> None:
    for thresholds in (_BY_ADDRESS, _GATHER, _SLICES, _STACKED):
        for name in thresholds:
            assert isinstance(getattr(_row_mover, name), int), name
