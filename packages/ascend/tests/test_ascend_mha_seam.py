"""The Ascend MHA host pool on the mover seam: shallow per-layer loads, one plan per batch."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import sgl_ascend
import sgl_core
from sgl_ascend import AscendMHADevicePool, AscendMHAHostPool
from sgl_ascend._backend import AscendBackend
from sgl_ascend._transfer import KvSplitMover
from sgl_core.backend import NEVER, CopyTuning, IOBackend
from sgl_core.testing import page_indices, random_bits
from sgl_core.transfer.copy._stream import stream_copy

OURS = (str(Path(sgl_core.__file__).parent), str(Path(sgl_ascend.__file__).parent))
COPIES = {"copy_", "_foreach_copy_", "index_copy_", "index_select"}
# our copy loops that are themselves the primitive (by-address blocks, numpy run copies)
PRIMITIVES = {"_memmove_all", "copy_slices", "take_rows"}
PATHS = {
    "by-address": CopyTuning(by_address_min_block_bytes=0, gather_below_page_run_bytes=0),
    "gather": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_page_run_bytes=NEVER),
    "run-copies": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_page_run_bytes=0),
}
IO = "kernel_ascend"

_needs_stream = pytest.mark.skipif(stream_copy() is None, reason="no streaming copy here")


def frames_at_copies(call: Callable[[], None]) -> list[int]:
    """Our frames (sgl_core, sgl_ascend) on the stack at each copy primitive."""
    depths: list[int] = []

    def ours(frame: types.FrameType | None) -> int:
        n = 0
        while frame is not None:
            n += frame.f_code.co_filename.startswith(OURS)
            frame = frame.f_back
        return n

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if (event == "c_call" and getattr(arg, "__name__", "") in COPIES) or (
            event == "call" and frame.f_code.co_name in PRIMITIVES
        ):
            depths.append(ours(frame))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return depths


def pools(tuning: CopyTuning | None, seed: int) -> tuple[AscendMHADevicePool, AscendMHAHostPool]:
    dev = sgl_ascend.backend.create_mha_device_pool(
        size=32, page_size=4, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=3,
        v_head_dim=4,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for buf in dev.components:
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))
    host = AscendBackend(tuning=tuning).create_host_pool(dev, layout="page_first_kv_split")
    assert isinstance(host, AscendMHAHostPool)
    return dev, host


@pytest.mark.parametrize("path", sorted(PATHS))
def test_per_layer_load_is_at_most_three_frames(path: str) -> None:
    dev, host = pools(PATHS[path], 1)
    dst, _ = pools(None, 2)
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, IO)
    host.load_to_device_per_layer(dst, h_idx, d_idx, 0, IO)
    depths = frames_at_copies(lambda: host.load_to_device_per_layer(dst, h_idx, d_idx, 1, IO))
    assert depths, "no copy seen"
    assert max(depths) <= 3, depths
    for layer in (0, 1):  # random bits hold NaNs: compare bytes
        pairs = zip(dst.get_kv_buffer(layer, d_idx), dev.get_kv_buffer(layer, d_idx), strict=True)
        for got, want in pairs:
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_loads_of_one_batch_share_one_plan() -> None:
    dev, host = pools(PATHS["by-address"], 1)
    h_idx, d_idx = page_indices([5, 0], 4), page_indices([1, 3], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, IO)
    mover = host._movers[IOBackend.KERNEL_ASCEND]
    assert isinstance(mover, KvSplitMover)
    plans = []
    for layer in range(3):
        host.load_to_device_per_layer(dev, h_idx, d_idx, layer, IO)
        last = mover._plans._last
        assert last is not None
        plans.append(last[1])
    assert plans[0] is plans[1] is plans[2]
    assert sorted(layer for _, layer in plans[0].steps) == [0, 1, 2]  # each layer's steps, kept
    host.load_to_device_per_layer(dev, h_idx.clone(), d_idx, 0, IO)  # new tensors: new plan
    last = mover._plans._last
    assert last is not None and last[1] is not plans[0]


def test_gather_loads_of_one_batch_share_one_buffer_per_component() -> None:
    """Every layer's gather step of a plan reuses this thread's buffer of its component
    (no fresh multi-MB temporary per layer), and the loads stay bit-exact."""
    dev, host = pools(PATHS["gather"], 1)
    dst, _ = pools(None, 2)
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, IO)
    mover = host._movers[IOBackend.KERNEL_ASCEND]
    assert isinstance(mover, KvSplitMover)
    for layer in range(3):
        host.load_to_device_per_layer(dst, h_idx, d_idx, layer, IO)
    last = mover._plans._last
    assert last is not None
    plan = last[1]
    assert len(plan.staging) == 2  # k and v, one thread
    ptrs = {b.untyped_storage().data_ptr() for b in plan.staging.values()}
    steps = [s for kept in plan.steps.values() for s in kept]
    assert {s.fn.__name__ for s in steps} == {"take_rows"}
    used = {s.parts[0][4].ctypes.data for s in steps}  # take_rows(dst, src, d, s, out, val)
    assert len(plan.steps) == 3 and used == ptrs  # three layers' steps, two buffers
    for layer in range(3):
        pairs = zip(dst.get_kv_buffer(layer, d_idx), dev.get_kv_buffer(layer, d_idx), strict=True)
        for got, want in pairs:
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize(
    ("threads", "limit", "streams", "path"),
    [
        (-1, 2 << 20, True, "copy_slices"),
        (0, 2 << 20, True, "copy_runs"),
        # long runs (limit 1): torch's run copies, unless AUTO may take the streaming copy
        (-1, 1, False, "copy_runs"),
        (1, 1, True, "copy_runs"),
        pytest.param(-1, 1, True, "copy_slices", marks=_needs_stream),
    ],
)
def test_cpu_run_copy_backups_are_numpy_slices(
    monkeypatch: pytest.MonkeyPatch, threads: int, limit: int, streams: bool, path: str
) -> None:
    """A CPU backup by run copies moves each run of every row as one numpy slice copy
    (``copy_threads`` 0: the torch run copies), bit-exact on the host pages. Long runs
    take torch's run copies unless ``AUTO`` may take the streaming copy; then core's
    ``backup_path`` chooses (this small backup, under ``AUTO_MIN_BYTES``: the slices)."""
    from sgl_core.transfer import _direct_load

    if not streams:
        monkeypatch.setattr(_direct_load, "stream_copy", lambda: None)

    seen = _spy_run_copies(monkeypatch)
    monkeypatch.setattr(_direct_load, "SLICES_MAX_RUN_BYTES", limit)  # 1: every run is long
    tuning = CopyTuning(gather_below_page_run_bytes=0, copy_threads=threads)
    dev, host = pools(tuning, 3)
    _check_backup(dev, host, pools(None, 4)[0], [5, 0, 1, 2], [1, 3, 4, 6], 4)
    assert seen[:1] == [path] and set(seen[: seen.index(path) + 1]) == {path}


def _spy_run_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the run copies that ran, in order: numpy slices (``copy_slices``)
    and torch's (``copy_runs``)."""
    from sgl_ascend import _transfer
    from sgl_core.transfer.copy import _steps

    seen: list[str] = []
    for module, name in ((_steps, "copy_slices"), (_transfer, "copy_runs")):
        real = getattr(module, name)

        def spy(*args: object, _real: object = real, _name: str = name, **kw: object) -> None:
            seen.append(_name)
            _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(module, name, spy)
    return seen


def _check_backup(
    dev: Any, host: Any, dst: Any, h_pages: list[int], d_pages: list[int], ps: int
) -> None:
    """Back up ``d_pages`` of ``dev`` to ``h_pages``, load them into ``dst``: the device
    pool is unchanged (a backup never writes it) and ``dst`` gets its original bytes."""
    h_idx, d_idx = page_indices(h_pages, ps), page_indices(d_pages, ps)
    before = [buf.view(torch.int16).clone() for buf in dev.components]  # random bits: NaNs
    host.backup_from_device_all_layer(dev, h_idx, d_idx, IO)
    now = [buf.view(torch.int16) for buf in dev.components]
    assert all(torch.equal(a, b) for a, b in zip(now, before, strict=True))
    for layer in range(dev.layer_num):
        host.load_to_device_per_layer(dst, h_idx, d_idx, layer, IO)
        pairs = zip(dst.get_kv_buffer(layer, d_idx), dev.get_kv_buffer(layer, d_idx), strict=True)
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in pairs)


@pytest.mark.parametrize(("limit", "path"), [(768, "copy_runs"), (769, "copy_slices")])
def test_runs_from_the_slices_limit_on_take_torch_run_copies(
    monkeypatch: pytest.MonkeyPatch, limit: int, path: str
) -> None:
    """Without the streaming copy, runs averaging core's ``SLICES_MAX_RUN_BYTES`` or more
    over every row of every component take torch's run copies: 4 pages of 3 layers (K 384
    and V 192 bytes a page) in 3 runs average 768 bytes."""
    from sgl_core.transfer import _direct_load

    seen = _spy_run_copies(monkeypatch)
    monkeypatch.setattr(_direct_load, "SLICES_MAX_RUN_BYTES", limit)
    monkeypatch.setattr(_direct_load, "stream_copy", lambda: None)
    dev, host = pools(CopyTuning(gather_below_page_run_bytes=0), 3)
    _check_backup(dev, host, pools(None, 4)[0], [5, 0, 1, 2], [1, 3, 4, 6], 4)
    assert seen[0] == path


@pytest.mark.parametrize("limit", [1, None], ids=["long runs", "short runs"])
@pytest.mark.parametrize(("runs_cost", "path"), [(5.0, "copy_slices"), (0.1, "copy_runs")])
def test_cpu_backup_runs_are_measured_against_torch_run_copies(
    monkeypatch: pytest.MonkeyPatch, runs_cost: float, path: str, limit: int | None
) -> None:
    """Under ``AUTO`` a backup of 1 MiB or more per component asks core's
    ``backup_path``, for long runs (``SLICES_MAX_RUN_BYTES`` set to 1) and short ones
    alike (the same rule as core's stacked backups): torch's run copies against the
    slices step (memmove or the streaming copy), on a fake clock; the faster runs,
    bit-exact, and the choice is a ``stacked`` key."""
    from sgl_ascend import _transfer
    from sgl_core.backend import copy_calibration
    from sgl_core.transfer import _direct_load
    from sgl_core.transfer.copy import _calibrate, _steps
    from sgl_core.transfer.copy._calibrate import Calibrator

    now, seen = [0.0], []
    costs = {"copy_slices": 1.0, "stream_each": 1.0, "copy_runs": runs_cost}
    for module, name in (
        (_steps, "copy_slices"),
        (_steps, "stream_each"),
        (_transfer, "copy_runs"),
    ):
        real = getattr(module, name)

        def spy(*args: object, _real: object = real, _name: str = name, **kw: object) -> None:
            seen.append(_name)
            now[0] += costs[_name]
            _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(module, name, spy)
    # the samples decide (no real-call trial: the slices' candidates all cost the same here)
    cal = Calibrator(timer=lambda: now[0], budget_s=1e9, confirm_calls=0)
    monkeypatch.setattr(_calibrate, "_default", cal)
    if limit is not None:
        monkeypatch.setattr(_direct_load, "SLICES_MAX_RUN_BYTES", limit)
    backend = AscendBackend(tuning=CopyTuning(gather_below_page_run_bytes=0))
    dev = backend.create_mha_device_pool(
        size=512, page_size=16, dtype=torch.bfloat16, head_num=8, head_dim=128, layer_num=3
    )
    assert isinstance(dev, AscendMHADevicePool)
    gen = torch.Generator().manual_seed(4)
    for buf in dev.components:
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))
    host = backend.create_host_pool(dev, layout="page_first_kv_split")
    pages = list(range(1, 17))
    h_idx, d_idx = page_indices(pages[::-1], 16), page_indices(pages, 16)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, IO)  # measures
    seen.clear()
    dst = backend.create_mha_device_pool(
        size=512, page_size=16, dtype=torch.bfloat16, head_num=8, head_dim=128, layer_num=3
    )
    _check_backup(dev, host, dst, pages[::-1], pages, 16)
    backups = seen[: len(seen) - seen[::-1].index(path)]  # the loads' copies come after
    assert set(backups) == {path}  # the slices' own choice: memmove "1" (all cost the same)
    keys = {c.key: c.choice for c in copy_calibration() if " per backup" in c.key}
    # K and V alike (16 pages x 3 layers x 16 tokens x 8 heads x 128, bf16: 1.5 MiB): 16
    # one-page runs of 96 KiB (a 32 KiB piece per layer), one key each for both
    assert keys == {
        "slices cpu->cpu 64KiB runs of 32KiB pieces, 1024KiB per backup": "1",
        "stacked cpu->cpu 64KiB runs of 32KiB pieces, 1024KiB per backup": path[5:],
    }
