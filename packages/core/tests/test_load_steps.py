"""Per-layer loads as bound copy steps: bounds, rebuilt steps, whole-call calibration."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import sgl_core
from sgl_core.backend import CopyTuning, IOBackend, Transfer, copy_calibration
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_core.transfer._direct_load import backup_path
from sgl_core.transfer.copy import _calibrate
from sgl_core.transfer.copy._calibrate import Calibrator
from sgl_core.transfer.copy._steps import Step, gather_step, memmove_step, slices_step
from sgl_core.transfer.copy._stream import stream_copy
from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES


def test_slices_step_copies_its_runs_and_refuses_runs_past_either_end() -> None:
    src = np.arange(40, dtype=np.int64).reshape(10, 4)
    dst = np.zeros((6, 4), dtype=np.int64)
    runs = [(7, 0, 2), (1, 4, 2)]
    slices_step(dst, src, runs, (9, 6), threads=1).run()
    assert (dst[0:2] == src[7:9]).all() and (dst[4:6] == src[1:3]).all()
    assert (dst[2:4] == 0).all()
    for extent in ((11, 6), (9, 7)):  # a slice would clamp: the step refuses instead
        with pytest.raises(RuntimeError, match="internal error"):
            slices_step(dst, src, runs, extent, threads=1)


@pytest.mark.parametrize("threads", [0, 1, 2])
def test_gather_and_memmove_steps_are_bit_exact(threads: int) -> None:
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(-(1 << 40), 1 << 40, (500, 9), generator=gen)
    dst = torch.zeros(300, 9, dtype=torch.int64)
    s_idx = torch.randperm(500, generator=gen)[:257]
    d_idx = torch.randperm(300, generator=gen)[:257]
    gather_step(dst, src, d_idx, s_idx, torch.empty(257, 9, dtype=torch.int64), threads).run()
    assert torch.equal(dst[d_idx], src[s_idx])
    out = torch.zeros(64, dtype=torch.uint8)
    data = torch.arange(64, dtype=torch.uint8)
    base_d, base_s = out.data_ptr(), data.data_ptr()
    memmove_step([base_d + 32, base_d], [base_s, base_s + 40], [8, 16], threads).run()
    assert torch.equal(out[32:40], data[0:8]) and torch.equal(out[0:16], data[40:56])
    assert int(out[16:32].sum()) == 0


def test_gather_step_takes_strided_rows_and_falls_back_where_rows_are_not_blocks() -> None:
    """Rows of one layer inside a token-major buffer (strided, at an offset that is not a
    multiple of a row) go through ``take_rows``; rows that are not one contiguous block
    each through the chunked torch gather; both bit-exact."""
    gen = torch.Generator().manual_seed(5)
    host = torch.randint(-(1 << 40), 1 << 40, (3 + 40 * 3 * 6,), generator=gen)
    rows = host[3:].view(40, 3, 6)[:, 1]  # (40, 6), row stride 18, storage offset 9
    s_idx, d_idx = torch.randperm(40, generator=gen)[:17], torch.randperm(20, generator=gen)[:17]
    for src, fn in ((rows, "take_rows"), (rows.view(40, 3, 2).transpose(1, 2), "gather_chunks")):
        dst = torch.zeros((20, *src.shape[1:]), dtype=torch.int64)
        step = gather_step(
            dst, src, d_idx, s_idx, torch.empty((17, *src.shape[1:]), dtype=torch.int64), 1
        )
        assert step.fn.__name__ == fn
        step.run()
        assert (
            torch.equal(dst[d_idx], src[s_idx])
            and int(dst[torch.isin(torch.arange(20), d_idx, invert=True)].abs().sum()) == 0
        )


def test_gather_step_from_a_one_row_source() -> None:
    """A source of one row (a one-page pool of page 1) takes ``take_rows`` too, into the
    destination rows asked for and no other; the caller's indices keep their values."""
    src = torch.tensor([[7, -8, 9 << 40]], dtype=torch.int64)
    dst = torch.zeros(4, 3, dtype=torch.int64)
    d_idx, s_idx = torch.tensor([2]), torch.tensor([0])
    step = gather_step(dst, src, d_idx, s_idx, torch.empty(1, 3, dtype=torch.int64), 1)
    assert step.fn.__name__ == "take_rows"
    step.run()
    assert torch.equal(dst[2], src[0]) and int(dst[[0, 1, 3]].abs().sum()) == 0
    assert d_idx.tolist() == [2] and s_idx.tolist() == [0]


@pytest.mark.parametrize("side", ["source", "destination"])
@pytest.mark.parametrize("bad", [-1, 40])
def test_take_step_refuses_indices_outside_its_rows(side: str, bad: int) -> None:
    """The flat view holds rows past ``src`` (other layers' rows) and numpy wraps a negative
    index: a bad index is refused when the step is built, before any byte moves."""
    host = torch.arange(50 * 2 * 4, dtype=torch.int64).view(50, 2, 4)
    src, dst = host[:40, 0], torch.zeros(40, 4, dtype=torch.int64)
    s_idx, d_idx = torch.tensor([3, 5]), torch.tensor([1, 2])
    (s_idx if side == "source" else d_idx)[1] = bad
    with pytest.raises(RuntimeError, match="internal error"):
        gather_step(dst, src, d_idx, s_idx, torch.empty(2, 4, dtype=torch.int64), 1)
    assert int(dst.abs().sum()) == 0


def test_load_steps_follow_a_replaced_device_layer() -> None:
    """Kept steps hold addresses: a layer tensor replaced under the same transfer gets
    new steps (the copy lands in the new tensor, not in the old one's memory)."""
    tuning = CopyTuning(by_address_min_block_bytes=0, copy_threads=1)
    backend = sgl_core.TorchBackend(tuning=tuning)
    kw = dict(size=64, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4)
    dev = backend.create_device_pool(layer_num=2, **kw)  # type: ignore[arg-type]
    back = backend.create_device_pool(layer_num=2, **kw)  # type: ignore[arg-type]
    fill_device_random(dev, 2)
    host = backend.create_host_pool(dev, layout="layer_first")
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    mover = host._movers[IOBackend.DIRECT]
    transfer = Transfer(back, h_idx, d_idx, IOBackend.DIRECT)
    mover.load(transfer, 1)
    old = back.kv_buffer[1]
    assert torch.equal(device_rows(back, 1, d_idx), device_rows(dev, 1, d_idx))
    back.kv_buffer[1] = torch.zeros_like(old)
    old.zero_()
    mover.load(transfer, 1)  # the same transfer object: its plan is kept
    assert torch.equal(device_rows(back, 1, d_idx), device_rows(dev, 1, d_idx))
    assert int(old.view(torch.int16).abs().sum()) == 0


def test_a_load_is_calibrated_on_its_whole_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """AUTO measures a load's thread count on the whole call (not a ~1 MiB sample of it),
    under a key naming the call's bytes, once: the next loads reuse the choice."""
    now = [0.0]

    def tick() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(_calibrate, "_default", Calibrator(timer=tick, budget_s=1e9))
    backend = sgl_core.TorchBackend(tuning=CopyTuning(by_address_min_block_bytes=0))
    kw = dict(size=2048, page_size=64, dtype=torch.bfloat16, kv_lora_rank=512)
    dev = backend.create_device_pool(qk_rope_head_dim=64, layer_num=2, **kw)  # type: ignore[arg-type]
    back = backend.create_device_pool(qk_rope_head_dim=64, layer_num=2, **kw)  # type: ignore[arg-type]
    fill_device_random(dev, 4)
    host = backend.create_host_pool(dev, layout="layer_first")
    h_idx = page_indices([3, 1, 7, 0, 5, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29], 64)
    d_idx = page_indices(list(range(2, 18)), 64)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    for layer in range(2):
        host.load_to_device_per_layer(back, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(back, layer, d_idx), device_rows(dev, layer, d_idx))
    whole = 1024 * 1152  # bytes of one layer's load: 16 pages of 64 tokens x 1152 B
    loads = [c for c in copy_calibration() if c.key.endswith("per load")]
    assert [c.key for c in loads] == ["memmove cpu->cpu 64KiB blocks, 1024KiB per load"]
    assert loads[0].nbytes == whole and loads[0].source == "measured"


@pytest.mark.parametrize(
    ("tuning", "path"),
    [
        (None, "copy_slices"),  # the cpu preset: CPU loads gather only below 4 KiB runs
        (CopyTuning(), "take_rows"),  # no load limit: gather_below_run_bytes (96 KiB)
        (CopyTuning(load_gather_below_run_bytes=1 << 20), "take_rows"),
    ],
)
def test_cpu_loads_take_the_load_gather_limit(
    monkeypatch: pytest.MonkeyPatch, tuning: CopyTuning | None, path: str
) -> None:
    from sgl_core.transfer.copy import _steps

    seen: list[str] = []
    for name in ("gather_chunks", "take_rows", "copy_slices"):
        real = getattr(_steps, name)

        def spy(*args: object, _real: object = real, _name: str = name) -> None:
            seen.append(_name)
            _real(*args)  # type: ignore[operator]

        monkeypatch.setattr(_steps, name, spy)
    backend = sgl_core.TorchBackend(tuning=tuning)
    kw = dict(size=256, page_size=16, dtype=torch.bfloat16, kv_lora_rank=512)
    dev = backend.create_device_pool(qk_rope_head_dim=64, layer_num=2, **kw)  # type: ignore[arg-type]
    back = backend.create_device_pool(qk_rope_head_dim=64, layer_num=2, **kw)  # type: ignore[arg-type]
    fill_device_random(dev, 6)
    host = backend.create_host_pool(dev, layout="page_first")
    h_idx, d_idx = page_indices([9, 2, 5], 16), page_indices([1, 7, 3], 16)  # 18 KiB runs
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    seen.clear()
    host.load_to_device_per_layer(back, h_idx, d_idx, 1, "direct")
    assert seen == [path]
    assert torch.equal(device_rows(back, 1, d_idx), device_rows(dev, 1, d_idx))


_STACKED = CopyTuning(stacked_min_run_bytes=0)
_needs_stream = pytest.mark.skipif(stream_copy() is None, reason="no streaming copy here")


@pytest.mark.parametrize(
    ("layout", "tuning", "path"),
    [
        ("layer_first", _STACKED, "copy_slices"),
        ("page_first", _STACKED, "copy_slices"),
        ("page_first_direct", _STACKED, "copy_slices"),
        ("page_head", _STACKED, "copy_runs"),  # heads outside the rows: torch run copies
        ("page_first", CopyTuning(stacked_min_run_bytes=0, copy_threads=0), "copy_runs"),
        # runs of SLICES_MAX_RUN_BYTES and more (set to 1): torch run copies unless AUTO
        # may take the streaming copy ("long": no streaming copy; "long 1": one thread)
        ("layer_first", "long", "copy_runs"),
        ("layer_first", "long 1", "copy_runs"),
        pytest.param("layer_first", "long auto", "copy_slices", marks=_needs_stream),
    ],
)
def test_stacked_cpu_backups_are_numpy_run_copies(
    monkeypatch: pytest.MonkeyPatch, layout: str, tuning: CopyTuning | str, path: str
) -> None:
    """A CPU backup of layers in one allocation copies each run across every row as one
    numpy slice copy (``copy_slices``), bit-exact; page_head and copy_threads 0 (ATen's
    threads) keep the torch run copies."""
    if isinstance(tuning, str):
        from sgl_core.transfer import _direct_load

        monkeypatch.setattr(_direct_load, "SLICES_MAX_RUN_BYTES", 1)
        if tuning == "long":
            monkeypatch.setattr(_direct_load, "stream_copy", lambda: None)
        tuning = (
            CopyTuning(stacked_min_run_bytes=0, copy_threads=1) if tuning == "long 1" else _STACKED
        )
    assert _stacked_paths(monkeypatch, layout, tuning) == [path]


@pytest.mark.parametrize(("above", "path"), [(0, "copy_runs"), (1, "copy_slices")])
def test_stacked_runs_from_the_slices_limit_on_take_torch_run_copies(
    monkeypatch: pytest.MonkeyPatch, above: int, path: str
) -> None:
    """Without the streaming copy, a stacked backup whose runs across every row reach
    ``SLICES_MAX_RUN_BYTES`` (a run's bytes per row times the rows) takes torch's run
    copies; one byte under it, numpy slices."""
    from sgl_core.transfer import _direct_load, _direct_mover

    monkeypatch.setattr(_direct_load, "stream_copy", lambda: None)
    sizes: list[int] = []

    def spy(mover: Any, plan: Any, c: int, stacked: torch.Tensor, t: int, run: int) -> Any:
        sizes.append(run * mover._wide(stacked).shape[0])
        return _direct_load.backup_slices(mover, plan, c, stacked, t, run)

    monkeypatch.setattr(_direct_mover, "backup_slices", spy)
    monkeypatch.setattr(_direct_load, "SLICES_MAX_RUN_BYTES", 1 << 40)
    assert _stacked_paths(monkeypatch, "layer_first", _STACKED) == ["copy_slices"]
    monkeypatch.setattr(_direct_load, "SLICES_MAX_RUN_BYTES", sizes[0] + above)
    assert _stacked_paths(monkeypatch, "layer_first", _STACKED) == [path]
    assert sizes[0] == sizes[1] == 3 * 256  # 3 rows; 16 tokens of 48 bytes in 3 runs


def _stacked_paths(monkeypatch: pytest.MonkeyPatch, layout: str, tuning: CopyTuning) -> list[str]:
    """The copies one backup ran (``copy_slices``, ``copy_runs``), checked bit-exact
    through the loads; a host pool half the device's and a device page past the host's
    end (each side's extent is checked against its own rows)."""
    from sgl_core.transfer import _direct_mover
    from sgl_core.transfer.copy import _steps

    seen: list[str] = []
    for module, name in ((_steps, "copy_slices"), (_direct_mover, "copy_runs")):
        real = getattr(module, name)

        def spy(*args: object, _real: object = real, _name: str = name, **kw: object) -> None:
            seen.append(_name)
            _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(module, name, spy)
    backend = sgl_core.TorchBackend(tuning=tuning)

    def pool() -> Any:
        if layout == "page_head":  # an MHA layout
            return backend.create_mha_device_pool(
                size=128, page_size=4, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=3
            )
        return backend.create_device_pool(
            size=128, page_size=4, dtype=torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=8,
            layer_num=3,
        )  # fmt: skip

    dev, back = pool(), pool()
    fill_device_random(dev, 8)
    host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=0.5)
    h_idx, d_idx = page_indices([9, 2, 3, 5], 4), page_indices([1, 7, 8, 30], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    backup = list(seen)
    for layer in range(3):
        host.load_to_device_per_layer(back, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(back, layer, d_idx), device_rows(dev, layer, d_idx))
    return backup


def _spy_stacked_paths(
    monkeypatch: pytest.MonkeyPatch, costs: dict[str, float], confirm_calls: int = 0
) -> tuple[list[float], list[str]]:
    """A fake clock that ``copy_slices`` and ``copy_runs`` advance by ``costs`` (mutable),
    the calibrator on it (``confirm_calls``: 0, the sample decides), and the list of
    paths that ran."""
    from sgl_core.transfer import _direct_mover
    from sgl_core.transfer.copy import _steps

    now, seen = [0.0], []
    for module, name in ((_steps, "copy_slices"), (_direct_mover, "copy_runs")):
        real = getattr(module, name)

        def spy(*args: object, _real: object = real, _name: str = name, **kw: object) -> None:
            seen.append(_name)
            now[0] += costs[_name]
            _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(module, name, spy)
    # (confirm_warmup_s=0: the trials time their first calls)
    cal = Calibrator(
        timer=lambda: now[0], budget_s=1e9, confirm_calls=confirm_calls, confirm_warmup_s=0
    )
    monkeypatch.setattr(_calibrate, "_default", cal)
    # the streaming copy would cost nothing on this clock (it runs neither spied copy)
    monkeypatch.setattr(_steps, "stream_copy", lambda: None)
    return now, seen


def _stacked_backups(
    tuning: CopyTuning, seen: list[str], calls: int, layout: str = "page_first"
) -> list[str]:
    """The path of each of ``calls`` backups (2.25 MiB per part) after a first one,
    each checked bit-exact through the loads."""
    backend = sgl_core.TorchBackend(tuning=tuning)
    kw = dict(size=1024, page_size=16, dtype=torch.bfloat16, kv_lora_rank=512)
    dev = backend.create_device_pool(qk_rope_head_dim=64, layer_num=4, **kw)  # type: ignore[arg-type]
    back = backend.create_device_pool(qk_rope_head_dim=64, layer_num=4, **kw)  # type: ignore[arg-type]
    fill_device_random(dev, 9)
    host = backend.create_host_pool(dev, layout=layout)
    pages = torch.randperm(32, generator=torch.Generator().manual_seed(3)).tolist()
    h_idx, d_idx = page_indices(pages, 16), page_indices(list(range(1, 33)), 16)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    paths = []
    for _ in range(calls):
        seen.clear()
        host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
        paths.append(seen[0])
    for layer in range(4):
        host.load_to_device_per_layer(back, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(back, layer, d_idx), device_rows(dev, layer, d_idx))
    return paths


_KEY = "stacked cpu->cpu 64KiB runs of 1KiB pieces, 2048KiB per backup"


@pytest.mark.parametrize(
    ("slices_cost", "path"),
    [(1.0, "copy_slices"), (1.9, "copy_slices"), (2.2, "copy_runs"), (5.0, "copy_runs")],
)
def test_a_stacked_backup_path_is_measured_once_per_shape(
    monkeypatch: pytest.MonkeyPatch, slices_cost: float, path: str
) -> None:
    """With AUTO threads a big stacked CPU backup times numpy slices against torch run
    copies once (the calibrator, reentrant: the run copies pick their own thread count
    inside the measurement), then takes the faster (one rank: no margin either way, slices
    a little faster win); an explicit thread count does not measure."""
    now, seen = _spy_stacked_paths(monkeypatch, {"copy_slices": slices_cost, "copy_runs": 2.0})
    assert _stacked_backups(CopyTuning(stacked_min_run_bytes=0), seen, 2) == [path, path]
    keys = [c for c in copy_calibration() if c.key.startswith("stacked ")]
    assert [(c.key, c.choice) for c in keys] == [(_KEY, path.removeprefix("copy_"))]
    now[0] += 60.0  # past min_interval_s: backups as fast as measured never make it stale
    assert _stacked_backups(CopyTuning(stacked_min_run_bytes=0), seen, 4) == [path] * 4
    (stacked,) = [c for c in copy_calibration() if c.key.startswith("stacked ")]
    assert stacked.source == "measured" and stacked.measured_at == keys[0].measured_at
    slices = [c.key for c in copy_calibration() if c.key.startswith("slices ")]
    assert slices == ["slices cpu->cpu 64KiB runs of 1KiB pieces, 2048KiB per backup"]
    explicit = CopyTuning(stacked_min_run_bytes=0, copy_threads=1)
    assert _stacked_backups(explicit, seen, 1) == ["copy_slices"]  # explicit: unmeasured


def test_stacked_backups_confirm_a_close_path_on_the_real_backups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slices 1.9 against runs 2.0 (close): the backups alternate the two paths, each
    checked bit-exact through the loads, until each ran twice; then the faster."""
    _, seen = _spy_stacked_paths(monkeypatch, {"copy_slices": 1.9, "copy_runs": 2.0}, 2)
    got = _stacked_backups(CopyTuning(stacked_min_run_bytes=0), seen, 5)
    # the first (untracked) backup measured and ran the sample's slices, untimed; then
    # runs, slices, runs, slices; then slices
    assert got == ["copy_runs", "copy_slices", "copy_runs", "copy_slices", "copy_slices"]
    (stacked,) = [c for c in copy_calibration() if c.key.startswith("stacked ")]
    assert stacked.source == "confirmed" and stacked.choice == "slices"


def test_backup_path_confirms_a_close_sample_on_the_real_backups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sample (the same whole part, repeated) has slices 1.0 against runs 1.2; the
    real backups after the measuring one take turns (runs first, the sample's order) and
    find slices at 3.0:
    runs is chosen, and each real backup is timed and reported as the path it ran."""
    now, ran = [0.0], []
    costs = {"runs": 1.2, "slices": 1.0}

    def path(name: str) -> Any:
        def run() -> None:
            ran.append(name)
            now[0] += costs[name]

        return run

    slices = Step(path("slices"), ((),))
    monkeypatch.setattr(_calibrate, "_default", Calibrator(timer=lambda: now[0], budget_s=1e9))
    first = backup_path(slices, path("runs"), AUTO, "x", AUTO_MIN_BYTES)
    assert ran == ["runs", "slices"] * 4  # the sample: a warm-up and 3 timed rounds
    costs["slices"] = 3.0
    ran.clear()
    first()
    for _ in range(7):
        backup_path(slices, path("runs"), AUTO, "x", AUTO_MIN_BYTES)()
    # the measuring call runs the sample's slices, untimed (its bytes are cache-hot);
    # then 3 real calls apiece, then the verdict
    assert ran == ["slices"] + ["runs", "slices"] * 3 + ["runs"]
    (choice,) = copy_calibration()
    assert choice.source == "confirmed" and choice.choice == "runs"
    assert choice.seconds == pytest.approx({"runs": 1.2, "slices": 3.0})


def test_backup_path_measures_parts_from_auto_min_bytes_under_auto(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Explicit thread counts and parts under ``AUTO_MIN_BYTES`` take the slices,
    unmeasured; from ``AUTO_MIN_BYTES`` on, ``AUTO`` measures the two paths."""
    ran: list[str] = []
    slices = Step(lambda: ran.append("slices"), ((),))
    monkeypatch.setattr(_calibrate, "_default", Calibrator(budget_s=1e9))
    for threads, nbytes in ((AUTO, AUTO_MIN_BYTES - 1), (1, AUTO_MIN_BYTES)):
        assert backup_path(slices, lambda: ran.append("runs"), threads, "x", nbytes) == slices.run
    assert copy_calibration() == [] and ran == []
    backup_path(slices, lambda: ran.append("runs"), AUTO, "x", AUTO_MIN_BYTES)()
    (choice,) = copy_calibration()
    assert choice.key.startswith("stacked cpu->cpu x, ") and set(choice.seconds) == {
        "runs",
        "slices",
    }
    assert ran.count("runs") > 1 and ran.count("slices") > 1  # warm-up and timed rounds


def test_stacked_backups_of_other_pieces_are_measured_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer_first and a page_first backup of the same runs cut them into other pieces
    (whole 16-token runs per layer, against 1152-byte rows 4 layers apart): each has its
    own stacked key, so neither inherits the other's choice."""
    _, seen = _spy_stacked_paths(monkeypatch, {"copy_slices": 1.0, "copy_runs": 2.0})
    for layout in ("layer_first", "page_first"):
        assert _stacked_backups(CopyTuning(stacked_min_run_bytes=0), seen, 1, layout)
    keys = sorted(c.key for c in copy_calibration() if c.key.startswith("stacked "))
    assert keys == [
        "stacked cpu->cpu 64KiB runs of 16KiB pieces, 2048KiB per backup",
        _KEY,
    ]


def test_a_stacked_backup_path_is_measured_again_when_its_copies_slow_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each backup reports its chosen path's time: run copies that turn 10x slower (an
    OpenMP team waiting for a busy core) make the key stale, and the next call measures
    again and takes the slices."""
    costs = {"copy_slices": 5.0, "copy_runs": 2.0}
    now, seen = _spy_stacked_paths(monkeypatch, costs)
    tuning = CopyTuning(stacked_min_run_bytes=0)
    assert _stacked_backups(tuning, seen, 1) == ["copy_runs"]
    costs["copy_runs"] = 20.0
    now[0] += 60.0  # past the calibrator's min_interval_s
    assert _stacked_backups(tuning, seen, 5)[-1] == "copy_slices"
    (choice,) = [c for c in copy_calibration() if c.key == _KEY]
    assert choice.choice == "slices" and choice.source == "re-measured"
