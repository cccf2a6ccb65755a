"""The pool/mover seam: one validated Transfer handed down, shallow loads, reused plans."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping
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
    MLAHostPoolBase,
    MoverFactory,
    PlanCache,
    TokenRowHostPool,
    Transfer,
)
from sgl_core.testing import device_rows, fill_device_random, page_indices

SRC = str(Path(sgl_core.__file__).parent)
COPIES = {"copy_", "_foreach_copy_", "index_copy_", "index_select"}
# our copy loops that are themselves the primitive (by-address blocks, numpy run copies)
PRIMITIVES = {"_memmove_all", "copy_slices", "take_rows"}
PATHS = {
    "by_address": CopyTuning(by_address_min_block_bytes=0),
    "gather": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_run_bytes=NEVER),
    "slices": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_run_bytes=0),
}


def pools(
    layout: str, ps: int = 4, tuning: CopyTuning | None = None
) -> tuple[sgl_core.backend.PerLayerMLADevicePool, TokenRowHostPool]:
    backend = sgl_core.TorchBackend(tuning=tuning)
    dev = backend.create_device_pool(
        size=8 * ps, page_size=ps, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4,
        layer_num=3,
    )  # fmt: skip
    fill_device_random(dev, 1)
    host = backend.create_host_pool(dev, layout=layout)
    assert isinstance(host, TokenRowHostPool)
    return dev, host


def frames_at_copies(call: types.FunctionType | object) -> list[int]:
    """Our frames on the stack at each copy primitive (torch op or memmove)."""
    depths: list[int] = []

    def ours(frame: types.FrameType | None) -> int:
        n = 0
        while frame is not None:
            n += frame.f_code.co_filename.startswith(SRC)
            frame = frame.f_back
        return n

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if (event == "c_call" and getattr(arg, "__name__", "") in COPIES) or (
            event == "call" and frame.f_code.co_name in PRIMITIVES
        ):
            depths.append(ours(frame))

    sys.setprofile(profile)
    try:
        call()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return depths


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_per_layer_load_is_at_most_three_frames(layout: str, path: str) -> None:
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


def test_probe_sees_deep_copies() -> None:
    """The frame counter is not vacuous: a copy five of our frames deep counts five."""
    host_pool = sys.modules[MLAHostPoolBase.__module__]
    assert host_pool.__file__ is not None and host_pool.__file__.startswith(SRC)
    code = "def f(n, t):\n    return f(n - 1, t) if n > 1 else t.copy_(t)\n"
    scope: dict[str, object] = {}
    exec(compile(code, host_pool.__file__, "exec"), scope)
    depths = frames_at_copies(lambda: scope["f"](5, torch.zeros(2)))  # type: ignore[operator]
    assert depths == [5]


def test_supported_pairs_come_from_the_movers() -> None:
    assert TokenRowHostPool.supported_pairs == {
        layout: frozenset(ios) for layout, ios in TokenRowHostPool.movers.items()
    }
    assert all(f is DirectMover for ios in TokenRowHostPool.movers.values() for f in ios.values())


def test_supported_pairs_cannot_be_declared_by_hand() -> None:
    with pytest.raises(TypeError, match="declare movers"):

        class HandWritten(TokenRowHostPool):
            supported_pairs: ClassVar[Mapping[HostLayout, frozenset[IOBackend]]] = {
                sgl_core.HostLayout.LAYER_FIRST: frozenset({sgl_core.IOBackend.KERNEL})
            }

    class Narrowed(TokenRowHostPool):
        movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]] = {
            sgl_core.HostLayout.PAGE_FIRST: {sgl_core.IOBackend.DIRECT: DirectMover}
        }

    assert Narrowed.supported_pairs == {
        sgl_core.HostLayout.PAGE_FIRST: frozenset({sgl_core.IOBackend.DIRECT})
    }
    assert TokenRowHostPool.supported_pairs != Narrowed.supported_pairs


def test_plan_kept_only_for_the_same_transfer() -> None:
    dev, _ = pools("layer_first")
    idx = page_indices([1], 4)
    cache: PlanCache[int] = PlanCache()
    a = Transfer(dev, idx, idx, sgl_core.IOBackend.DIRECT)
    built: list[int] = []

    def build(value: int) -> Callable[[Transfer], int]:
        def make(transfer: Transfer) -> int:
            built.append(value)
            return value

        return make

    assert cache.get(a, build(1)) == 1
    assert cache.get(a, build(2)) == 1
    b = Transfer(dev, idx, idx, sgl_core.IOBackend.DIRECT)  # equal fields, another object
    assert cache.peek(b) is None
    assert cache.get(b, build(3)) == 3
    assert cache.peek(b) == 3
    assert built == [1, 3]


def test_gather_buffer_reused_across_repeated_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, host = pools("page_first", tuning=PATHS["gather"])
    dst, _ = pools("page_first")
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    allocations: list[tuple[int, ...]] = []
    real_empty = torch.empty

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        allocations.append(tuple(args[0]) if args and isinstance(args[0], tuple) else ())
        return real_empty(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(torch, "empty", counting)
    for _ in range(3):
        for layer in range(3):
            host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "direct")
    assert len(allocations) == 1  # one staging buffer for every layer and repeat
    for layer in range(3):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(dev, layer, d_idx))
