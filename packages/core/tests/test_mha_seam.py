"""The MHA host pools on the mover seam: shallow loads, reused plans, derived pairs."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core.backend import (
    NEVER,
    CopyTuning,
    DirectMover,
    HostLayout,
    IOBackend,
    MHATokenHostPool,
    PerLayerMHADevicePool,
)
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_core.transfer._transfer import MoverFactory

_SEAM = Path(__file__).with_name("test_transfer_seam.py")
_spec = importlib.util.spec_from_file_location("_mla_seam_probe", _SEAM)
assert _spec is not None and _spec.loader is not None
_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_probe)
frames_at_copies = _probe.frames_at_copies

PATHS = {
    "by_address": CopyTuning(by_address_min_block_bytes=0),
    "gather": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_run_bytes=NEVER),
    "slices": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_run_bytes=0),
}
LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]


def pools(
    layout: str, tuning: CopyTuning | None = None
) -> tuple[PerLayerMHADevicePool, MHATokenHostPool]:
    backend = sgl_core.TorchBackend(tuning=tuning)
    dev = backend.create_mha_device_pool(
        size=32, page_size=4, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=3
    )
    fill_device_random(dev, 1)
    host = backend.create_host_pool(dev, layout=layout)
    assert isinstance(dev, PerLayerMHADevicePool) and isinstance(host, MHATokenHostPool)
    return dev, host


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_per_layer_mha_load_is_at_most_three_frames(layout: str, path: str) -> None:
    dev, host = pools(layout, tuning=PATHS[path])
    dst, _ = pools(layout)
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    host.load_to_device_per_layer(dst, h_idx, d_idx, 0, "direct")
    depths = frames_at_copies(lambda: host.load_to_device_per_layer(dst, h_idx, d_idx, 1, "direct"))
    assert depths, "no copy seen"
    assert max(depths) <= 3, depths
    for layer in (0, 1):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(dev, layer, d_idx))


def test_mha_supported_pairs_come_from_the_movers() -> None:
    assert MHATokenHostPool.supported_pairs == {
        layout: frozenset(ios) for layout, ios in MHATokenHostPool.movers.items()
    }
    with pytest.raises(TypeError, match="declare movers"):

        class HandWritten(MHATokenHostPool):
            supported_pairs: ClassVar[Mapping[HostLayout, frozenset[IOBackend]]] = {
                HostLayout.PAGE_HEAD: frozenset({IOBackend.KERNEL})
            }

    class Narrowed(MHATokenHostPool):
        movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
            HostLayout.PAGE_HEAD: {IOBackend.DIRECT: DirectMover}
        }

    assert Narrowed.supported_pairs == {HostLayout.PAGE_HEAD: frozenset({IOBackend.DIRECT})}
    backend = sgl_core.backend.PoolBackend(
        sgl_core.backend.PerLayerMLADevicePool,
        sgl_core.backend.TokenRowHostPool,
        mha_device_pool_class=PerLayerMHADevicePool,
        mha_host_pool_class=Narrowed,
    )
    assert backend.supported_mha_pairs == Narrowed.supported_pairs
    dev, _ = pools("page_head")
    with pytest.raises(sgl_core.errors.UnsupportedLayoutError, match="page_head"):
        backend.create_host_pool(dev, layout="layer_first")


@pytest.mark.parametrize("layout", ["page_first", "page_head"])
def test_repeated_mha_loads_allocate_nothing_big(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first layer of a batch, loads reuse the plan: no new staging tensors."""
    dev, host = pools(layout, tuning=PATHS["gather"])
    dst, _ = pools(layout)
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    allocations: list[object] = []
    real_empty = torch.empty

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        allocations.append(args[0] if args else None)
        return real_empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(torch, "empty", counting)
    for _ in range(3):
        for layer in range(3):
            host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "direct")
    assert len(allocations) == 2  # one staging buffer each for K and V, for every repeat
    for layer in range(3):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(dev, layer, d_idx))


def test_by_address_mha_plan_keeps_block_addresses() -> None:
    dev, host = pools("page_first_direct", tuning=PATHS["by_address"])
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    mover = host._movers[IOBackend.DIRECT]
    assert isinstance(mover, DirectMover)
    checked = host._last_checked
    assert checked is not None
    plan = mover._plans.peek(checked.transfer)
    # Kept per (component, row): K and V of layer 0.
    assert plan is not None and set(plan.addresses) == {(0, 0), (1, 0)}
    kept = dict(plan.addresses)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    assert mover._plans.peek(checked.transfer) is plan
    assert all(plan.addresses[key] is kept[key] for key in kept)
