"""The streaming (non-temporal store) copy: bit-exact over sizes and alignments, W^X, its
fallbacks, and how the copy steps offer it (a calibrated candidate, after memmove)."""

from __future__ import annotations

import ctypes
import dataclasses
import platform
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import sgl_core
from sgl_core.backend import CopyTuning, copy_calibration
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_core.transfer.copy import _calibrate, _copy, _steps, _stream, _stream_table
from sgl_core.transfer.copy._calibrate import Calibrator
from sgl_core.transfer.copy._steps import copy_slices, memmove_step, slices_shape, slices_step
from sgl_core.transfer.copy._stream_code import SSE2
from sgl_core.transfer.copy._stream_table import piece_bytes, slice_ops
from sgl_core.transfer.copy._turns import confirm_call

needs_stream = pytest.mark.skipif(
    _stream.stream_copy() is None, reason=f"streaming copy: {_stream.stream_copy_status()}"
)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next ``stream_copy()`` load again (and put the process's load back after)."""
    monkeypatch.setattr(_stream, "_loaded", None)


Array = np.ndarray[Any, Any]


def _pieces(
    rng: np.random.Generator, dst: Array, src: Array
) -> tuple[list[tuple[int, int, int]], Array]:
    """(dst, src, len) pieces over every size class and destination alignment, each with a
    gap, and what ``dst`` must hold after them."""
    want, ops, at = dst.copy(), [], 0
    for n in (0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 1152, 4096, 18432 + 7):
        for skew in (0, 1, 8, 16, 33):
            at += skew
            s = int(rng.integers(0, 4000))
            ops.append((dst.ctypes.data + at, src.ctypes.data + s, n))
            want[at : at + n] = src[s : s + n]
            at += n + 5
    return ops, want


@needs_stream
def test_stream_copy_is_bit_exact_over_sizes_and_alignments() -> None:
    """Aligned and unaligned destinations and sources, lengths below, at and past 64 bytes
    and not a multiple of it: every piece lands exactly, no byte in the gaps moves."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, 1 << 18, dtype=np.uint8)
    dst = rng.integers(0, 256, 1 << 19, dtype=np.uint8)
    ops, want = _pieces(rng, dst, src)
    _stream.stream_each(_stream_table.ops_table(*zip(*ops, strict=True)))
    assert np.array_equal(dst, want)
    _stream.stream_each(_stream_table.ops_table([], [], []))  # nothing to copy: a no-op
    assert np.array_equal(dst, want)


@needs_stream
def test_the_code_is_loaded_once_per_process(monkeypatch: pytest.MonkeyPatch, fresh: None) -> None:
    monkeypatch.delenv(_stream.ENV_VAR, raising=False)  # the kernel the CPU's flags pick
    first = _stream.stream_copy()
    assert first is not None and _stream.stream_copy() is first
    kernel = _stream.pick_kernel("", _stream.cpu_flags())
    assert not isinstance(kernel, str)
    assert _stream.stream_copy_status() == f"available ({kernel.name})"


def test_a_unit_is_cut_into_its_contiguous_blocks() -> None:
    """Dimensions of one item (any stride) merge into the block; a gap starts new blocks."""
    base = np.zeros((8, 3, 4, 6), dtype=np.uint16)
    odd = np.lib.stride_tricks.as_strided(base, (8, 4, 1, 6), (144, 12, 1000, 2))
    assert [(b, o.tolist()) for b, o in map(_stream_table._unit_blocks, (base, odd))] == [
        (144, [0]), (48, [0]),
    ]  # fmt: skip
    block, offsets = _stream_table._unit_blocks(base[:, :, 1:3])
    assert (block, offsets.tolist()) == (24, [0, 48, 96])


@needs_stream
def test_the_code_page_is_never_writable_and_executable() -> None:
    """The gather's page reads r-x in /proc/self/maps (written while rw-, then switched)."""
    fn = _stream.stream_copy()
    raw: Any = fn  # a ctypes function pointer (typed as the callable it is)
    addr = ctypes.cast(raw, ctypes.c_void_p).value
    assert addr is not None
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            assert line.split()[1].startswith("r-x")
            return
    pytest.fail("the gather's page is not mapped")


@pytest.mark.parametrize(
    "table",
    [
        np.zeros((2, 3), dtype=np.int64),
        np.zeros((2, 4), dtype=np.uint64),
        np.zeros(6, dtype=np.uint64),
        np.zeros((3, 2), dtype=np.uint64).T,
    ],
    ids=["int64", "four columns", "flat", "not C-ordered"],
)
def test_a_table_the_gather_cannot_read_is_refused(table: np.ndarray[Any, Any]) -> None:
    with pytest.raises(ValueError, match=re.escape(f"table, got {table.dtype} {table.shape}")):
        _stream.stream_each(table)


@pytest.mark.parametrize("value", ["0", "off", "OFF", " no ", "false"])
def test_the_environment_turns_the_streaming_copy_off(
    monkeypatch: pytest.MonkeyPatch, fresh: None, value: str
) -> None:
    monkeypatch.setenv(_stream.ENV_VAR, value)
    assert _stream.stream_copy() is None
    assert _stream.stream_copy_status().startswith("off")
    with pytest.raises(RuntimeError, match="not loaded: off"):
        _stream.stream_each(_stream_table.ops_table([], [], []))


@pytest.mark.parametrize("machine", ["x86_64", "AMD64", "amd64"])
def test_x86_64_linux_maps_the_code_under_either_machine_name(
    monkeypatch: pytest.MonkeyPatch, fresh: None, machine: str
) -> None:
    monkeypatch.delenv(_stream.ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(_stream, "_map_code", lambda libc, code: "refused here")
    assert _stream.stream_copy() is None
    assert _stream.stream_copy_status() == "unavailable: refused here"  # it tried to map


@pytest.mark.parametrize(("plat", "machine"), [("darwin", "x86_64"), ("linux", "aarch64")])
def test_only_x86_64_linux_loads_the_code(
    monkeypatch: pytest.MonkeyPatch, fresh: None, plat: str, machine: str
) -> None:
    monkeypatch.delenv(_stream.ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "platform", plat)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(_stream, "_map_code", lambda libc, code: pytest.fail("mapped"))
    assert _stream.stream_copy() is None
    assert "x86-64 Linux only" in _stream.stream_copy_status()


class _Fn:
    def __init__(self, result: Any) -> None:
        self.result, self.calls = result, list[tuple[Any, ...]]()

    def __call__(self, *args: Any) -> Any:
        self.calls.append(args)
        return self.result


class _FakeLibc:
    """mmap into a ctypes buffer (or failing), mprotect answering ``protect``."""

    def __init__(self, mapped: bool | None, protect: int) -> None:
        self.buf = ctypes.create_string_buffer(4096)
        failed = None if mapped is None else ctypes.c_void_p(-1).value  # NULL, MAP_FAILED
        self.mmap = _Fn(ctypes.addressof(self.buf) if mapped else failed)
        self.mprotect = _Fn(protect)


@pytest.mark.parametrize(
    ("mapped", "protect", "why"),
    [
        (None, 0, "mmap of a read\\+write page failed"),
        (False, 0, "mmap of a read\\+write page failed"),
        (True, -1, "mprotect .* refused"),
    ],
)
def test_a_refused_mapping_leaves_the_copy_unavailable(
    mapped: bool | None, protect: int, why: str
) -> None:
    libc = _FakeLibc(mapped, protect)
    got = _stream._map_code(libc, SSE2.code)
    assert isinstance(got, str)
    assert re.search(why, got)
    if mapped:  # the code was written before the switch, which asked for read+execute only
        assert libc.buf.raw[: len(SSE2.code)] == SSE2.code
        assert libc.mprotect.calls == [(ctypes.addressof(libc.buf), 4096, 0x5)]
    assert libc.mmap.calls[0][2] == 0x3  # read+write, never executable while written


def test_a_refused_mapping_is_reported_and_the_steps_offer_memmove_only(
    monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    monkeypatch.delenv(_stream.ENV_VAR, raising=False)
    monkeypatch.setattr(_stream, "_map_code", lambda libc, code: "mprotect to read+execute refused")
    assert _stream.stream_copy() is None
    assert _stream.stream_copy_status() == "unavailable: mprotect to read+execute refused"
    names = _measured_candidates(monkeypatch)
    assert names == ["1", "2"]


def _measured_candidates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The candidates a big AUTO memmove step is measured with (fake clock: 1 s each)."""
    now = [0.0]

    def tick() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(_copy, "_workers", 1)
    # every candidate ties on this clock: the sample decides (no real-call trial)
    cal = Calibrator(timer=tick, budget_s=1e9, confirm_calls=0)
    monkeypatch.setattr(_calibrate, "_default", cal)
    src = torch.randint(0, 255, (4 << 20,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    blocks = [(dst.data_ptr() + i * (64 << 10), src.data_ptr() + i * (64 << 10)) for i in range(64)]
    d, s = zip(*blocks, strict=True)
    memmove_step(list(d), list(s), [64 << 10] * 64, -1).run()
    assert torch.equal(dst, src)
    (choice,) = copy_calibration()
    return list(choice.seconds)


def _spy(
    monkeypatch: pytest.MonkeyPatch, costs: dict[str, float], confirm_calls: int = 0
) -> list[float]:
    """A fake clock that ``memmove_each``/``copy_slices``/``stream_each`` advance by
    ``costs`` (per call, read at the call), as the process's calibrator (``confirm_calls``
    0: the samples decide). The streaming team (``team_each``: a kept table on several
    threads) costs ``stream_each``'s per thread, as a part per thread did."""
    now = [0.0]
    names = [(name, name) for name in costs]
    if "stream_each" in costs:
        names.append(("team_each", "stream_each"))
    for name, priced in names:
        real = getattr(_steps, name)
        team = name == "team_each"  # (ops, bounds, threads)

        def spy(*args: Any, _real: Any = real, _name: str = priced, _team: bool = team) -> None:
            now[0] += costs[_name] * (args[2] if _team else 1)
            _real(*args)

        monkeypatch.setattr(_steps, name, spy)
    monkeypatch.setattr(_copy, "_workers", 1)
    monkeypatch.setattr(_steps, "AUTO_MIN_BYTES", 0)  # measure small steps too
    # (confirm_warmup_s=0: the trials time their first calls)
    cal = Calibrator(
        timer=lambda: now[0], budget_s=1e9, confirm_calls=confirm_calls, confirm_warmup_s=0
    )
    monkeypatch.setattr(_calibrate, "_default", cal)
    return now


@needs_stream
@pytest.mark.parametrize(
    ("stream_cost", "chosen"),
    [(1.0, "1"), (0.9, "stream1"), (0.1, "stream1")],
    ids=["as fast", "a little faster", "faster"],
)
def test_a_memmove_load_takes_the_streaming_copy_when_it_is_faster(
    monkeypatch: pytest.MonkeyPatch, stream_cost: float, chosen: str
) -> None:
    """Candidates ``1``, ``2``, ``stream1``, ``stream2``: the streaming copy competes with
    memmove on as many threads on speed alone (a tie keeps memmove; only more threads
    must beat the margin), and then a layer_first CPU load through the pools takes it,
    bit-exact; explicit threads never measure it."""
    _spy(monkeypatch, {"memmove_each": 1.0, "stream_each": stream_cost})
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
    (load,) = [c for c in copy_calibration() if c.key.endswith("per load")]
    assert list(load.seconds) == ["1", "2", "stream1", "stream2"]
    assert load.choice == chosen
    step = memmove_step([0, 0], [0, 0], [2 << 20] * 2, 1)  # explicit: memmove, unmeasured,
    assert step.fn is _steps.memmove_each and len(step.parts) == 1  # on this thread only


@needs_stream
def test_a_load_step_confirms_a_close_sample_on_the_real_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A close sample (``stream1`` 0.9 against memmove's 1.0): the step takes the trial's
    turns on its real calls, bit-exact each, and the real calls decide (memmove, 0.5
    there); later steps of the key are built plain."""
    costs = {"memmove_each": 1.0, "stream_each": 0.9}
    now = _spy(monkeypatch, costs, confirm_calls=2)
    src = torch.randint(0, 255, (4 << 20,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    d = [dst.data_ptr() + i * (64 << 10) for i in range(64)]
    s = [src.data_ptr() + i * (64 << 10) for i in range(64)]
    step = memmove_step(d, s, [64 << 10] * 64, -1)
    assert step.fn is confirm_call
    # another layer's step of the key, built while it is confirmed: it takes turns too
    assert memmove_step(d, s, [64 << 10] * 64, -1).fn is confirm_call
    (sample,) = copy_calibration()
    assert sample.choice == "stream1" and sample.source == "measured"
    costs["memmove_each"] = 0.5  # the whole loads rank them the other way
    took = []
    for _ in range(6):
        dst.zero_()
        start = now[0]
        step.run()
        took.append(now[0] - start)
        assert torch.equal(dst, src)
    # the measuring call runs the sample's stream1, untimed; 1, stream1, 1, stream1; 1
    assert took == pytest.approx([0.9, 0.5, 0.9, 0.5, 0.9, 0.5])
    with monkeypatch.context() as patch:  # the step keeps its verdict: nothing is asked
        patch.setattr(_calibrate.default_calibrator(), "turn", None)
        dst.zero_()
        start = now[0]
        step.run()
    assert torch.equal(dst, src) and now[0] - start == pytest.approx(0.5)
    (choice,) = copy_calibration()
    assert choice.source == "confirmed" and choice.choice == "1"
    assert set(choice.seconds) == {"1", "stream1"}  # 2 and stream2 were not close
    again = memmove_step(d, s, [64 << 10] * 64, -1)
    assert again.fn is _steps.memmove_each


@needs_stream
def test_a_choice_this_process_does_not_offer_is_measured_again(
    monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    """A disk-cached ``stream1`` where the streaming copy is off: measured again among
    the memmove counts (never a failed lookup, never the streaming copy)."""
    names = _measured_candidates(monkeypatch)
    assert names == ["1", "2", "stream1", "stream2"]
    cal = _calibrate.default_calibrator()
    key = copy_calibration()[0].key
    cal._choices[key] = dataclasses.replace(cal._choices[key], choice="stream1")  # as if from disk
    monkeypatch.setenv(_stream.ENV_VAR, "0")
    monkeypatch.setattr(_stream, "_loaded", None)
    src = torch.randint(0, 255, (4 << 20,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    d = [dst.data_ptr() + i * (64 << 10) for i in range(64)]
    s = [src.data_ptr() + i * (64 << 10) for i in range(64)]
    step = memmove_step(d, s, [64 << 10] * 64, -1)
    assert step.fn is _steps.memmove_each
    step.run()
    assert torch.equal(dst, src)
    assert list(copy_calibration()[0].seconds) == ["1", "2"]


def _layouts() -> list[tuple[str, np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(11)
    host = rng.integers(0, 1 << 62, (40, 5, 16, 20), dtype=np.uint64)  # pages, layers, tokens, row
    token_major = host.transpose(0, 2, 1, 3)  # pages, tokens, layers, row
    return [
        ("page contiguous", host[:, 2]),
        ("rows apart", token_major[:, :, 3]),
        ("every other token", host[:, 1, ::2]),
        ("partial rows", host[:, 4, :, 2:12]),
    ]


@needs_stream
@pytest.mark.parametrize(("name", "src"), _layouts(), ids=[n for n, _ in _layouts()])
def test_slice_ops_moves_what_copy_slices_moves(
    monkeypatch: pytest.MonkeyPatch, name: str, src: np.ndarray[Any, Any]
) -> None:
    """Units that are one block, rows apart, strided rows and partial rows, to a destination
    of the same and of another layout: the streaming table moves exactly the run copies'
    bytes (other rows untouched); through ``slices_step`` when it is chosen too."""
    runs = [(3, 0, 2), (10, 5, 1), (39, 29, 1), (0, 20, 4), (20, 9, 3)]
    for dst_shape in ("contiguous", "strided"):
        base = np.full((30, 2, *src.shape[1:]), 7, dtype=src.dtype)
        dst = base[:, 0] if dst_shape == "strided" else np.ascontiguousarray(base[:, 0])
        want = dst.copy()
        copy_slices(want, src, runs)
        _stream.stream_each(slice_ops(dst, src, runs))
        assert np.array_equal(dst, want) and (base[:, 1] == 7).all()
        dst[:] = 7
        _spy(monkeypatch, {"copy_slices": 1.0, "stream_each": 0.1})
        step = slices_step(dst, src, runs, (40, 30), -1)
        assert step.fn is vars(_steps)["stream_each"]  # the spy: chosen, not memmove
        dst[:] = 7  # measuring ran every candidate: only the chosen step's bytes count
        step.run()
        assert np.array_equal(dst, want)
        monkeypatch.undo()


def test_slices_that_convert_items_never_take_the_streaming_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """numpy slice assignment converts items between dtypes: no byte copy is offered."""
    src = np.arange(64 * 1024, dtype=np.int32).reshape(64, 1024)
    dst = np.zeros((64, 1024), dtype=np.int64)
    _spy(monkeypatch, {"copy_slices": 1.0, "stream_each": 0.01})
    slices_step(dst, src, [(0, 0, 64)], (64, 64), -1).run()
    assert np.array_equal(dst, src)
    (choice,) = copy_calibration()
    assert "stream1" not in choice.seconds


@needs_stream
def test_a_measured_step_with_nothing_to_copy_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    dst, src = np.zeros((4, 8), dtype=np.uint8), np.ones((4, 8), dtype=np.uint8)
    _spy(monkeypatch, {"copy_slices": 1.0, "stream_each": 0.1})
    slices_step(dst, src, [], (0, 0), -1).run()
    memmove_step([], [], [], -1).run()
    assert not dst.any()
    assert len(copy_calibration()) == 2  # measured: nothing to copy is not "under the limit" 0


@needs_stream
@pytest.mark.parametrize("what", ["load", "backup"])
def test_a_backup_builds_its_streaming_table_inside_each_timed_call(
    monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A load's steps are kept, so its slices table is built once, with the step; a
    backup builds its steps per call, so its table is built inside every run (what the
    calibrator times with it), in the source's order (a load's in item order:
    test_stream_order.py). By-address backups are not offered the streaming copy."""
    _spy(monkeypatch, {"copy_slices": 1.0, "memmove_each": 1.0, "stream_each": 0.1})
    built: list[int] = []
    orders: set[bool] = set()

    def counted(dst: Any, src: Any, runs: Any, by_source: bool = False) -> Any:
        built.append(1)
        orders.add(by_source)
        return slice_ops(dst, src, runs, by_source=by_source)

    monkeypatch.setattr(_steps, "slice_ops", counted)
    src, dst = np.ones((64, 1024), dtype=np.uint8), np.zeros((64, 1024), dtype=np.uint8)
    step = slices_step(dst, src, [(0, 0, 64)], (64, 64), -1, what)
    measured = len(built)
    step.run()
    step.run()
    assert (dst == 1).all()
    # stream1 and stream2 built once each; a backup's measured runs built theirs too
    assert (measured, len(built)) == ((2, 2) if what == "load" else (measured, measured + 2))
    assert what == "load" or measured > 2
    assert orders == {what == "backup"}
    d = [dst.ctypes.data + i * 1024 for i in range(64)]
    s = [src.ctypes.data + i * 1024 for i in range(64)]
    memmove_step(d, s, [1024] * 64, -1, what).run()
    offered = {c.key.split()[0]: ("stream1" in c.seconds, c.choice) for c in copy_calibration()}
    by_address = (True, "stream1") if what == "load" else (False, "1")
    assert offered == {"slices": (True, "stream1"), "memmove": by_address}


@needs_stream
def test_copies_the_streaming_stores_would_get_wrong_or_slow_are_not_offered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sides in one buffer (memmove and numpy slices allow overlap, streaming stores do
    not) and pieces under 64 bytes (``rep movsb`` only): measured without it."""
    _spy(monkeypatch, {"copy_slices": 1.0, "memmove_each": 1.0, "stream_each": 0.1})
    buf = np.arange(64 * 64, dtype=np.uint64).reshape(64, 64)  # 512-byte units
    want = buf.copy()
    want[40:48] = want[0:8]
    slices_step(buf, buf, [(0, 40, 8)], (8, 48), -1).run()  # one buffer (disjoint runs)
    assert np.array_equal(buf, want)
    raw = buf.ctypes.data  # one block shifted 8 bytes onto itself: measured by repeating
    memmove_step([raw + 8], [raw], [8 * 64 * 40], -1)  # it (not idempotent: no byte check)
    small = np.zeros((64, 64, 8), dtype=np.uint8), np.ones((64, 64, 16), dtype=np.uint8)
    slices_step(small[0], small[1][:, :, :8], [(0, 0, 64)], (64, 64), -1).run()  # 8-byte pieces
    assert (small[0] == 1).all()
    assert len(copy_calibration()) == 3
    assert not any("stream1" in c.seconds for c in copy_calibration())


@pytest.mark.parametrize(
    ("dst", "src", "sizes", "meet"),
    [
        ([4096], [0], [4096], False),  # adjacent
        ([4095], [0], [4096], True),  # one byte in common
        ([0], [4095], [4096], True),  # the other way round
        ([0, 10_000], [5000, 20_000], [1000, 1000], False),  # interleaved buffers
        ([0, 10_000], [5000, 10_500], [1000, 1000], True),  # the second pair meets
        ([100, 0], [150, 9000], [100, 5000], True),  # unsorted; inside a long block
        ([0, 0], [300, 5000], [5000, 10], True),  # a short block after a long one
        ([500], [500], [0], False),  # an empty block moves nothing
        ([0], [4096], [4096], False),  # adjacent, the source after
        ([0], [0], [1], True),  # one byte
        ([0, 2000], [5000, 500], [1000, 0], False),  # an empty source inside a destination
        ([], [], [], False),
    ],
)
def test_blocks_overlap_exactly(
    dst: list[int], src: list[int], sizes: list[int], meet: bool
) -> None:
    assert _stream_table._blocks_overlap(dst, src, sizes) is meet


@needs_stream
def test_the_piece_limit_counts_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of exactly 64 bytes are offered; a destination of 32-byte blocks under a
    contiguous source is not (the piece is the smaller side's)."""
    _spy(monkeypatch, {"copy_slices": 1.0, "stream_each": 0.1})
    wide = np.zeros((64, 8, 2, 8), dtype=np.uint64)  # units of 8 x 128 bytes
    src = np.ones((64, 8, 8), dtype=np.uint64)
    slices_step(wide[:, :, 0], src, [(0, 0, 64)], (64, 64), -1).run()  # 64-byte pieces
    half = np.zeros((64, 8, 2, 4), dtype=np.uint64)
    src4 = np.ones((64, 8, 4), dtype=np.uint64)
    slices_step(half[:, :, 0], src4, [(0, 0, 64)], (64, 64), -1).run()  # 32-byte pieces
    assert (wide[:, :, 0] == 1).all() and (wide[:, :, 1] == 0).all()
    assert (half[:, :, 0] == 1).all() and (half[:, :, 1] == 0).all()
    offered = sorted(("stream1" in c.seconds, c.nbytes) for c in copy_calibration())
    assert offered == [(False, 64 * 8 * 32), (True, 64 * 8 * 64)]


@needs_stream
def test_slice_ops_cuts_at_the_destinations_blocks_too() -> None:
    """A contiguous source into a destination whose rows lie apart: the pieces are the
    destination's rows (the smaller blocks), not the source's whole units."""
    rng = np.random.default_rng(5)
    src = rng.integers(0, 1 << 62, (20, 16, 10), dtype=np.uint64)
    base = np.zeros((12, 16, 3, 10), dtype=np.uint64)
    dst = base[:, :, 1]
    runs = [(4, 0, 3), (19, 7, 1), (0, 9, 2)]
    want = dst.copy()
    copy_slices(want, src, runs)
    _stream.stream_each(slice_ops(dst, src, runs))
    assert np.array_equal(dst, want) and not base[:, :, 0].any() and not base[:, :, 2].any()


def _token_rows(tokens: int, layers: int, major: str, fill: int = 0) -> Array:
    """``(tokens, layers, 8)`` uint64 rows (64 bytes per token and layer), the bytes laid
    out layer-major (a ``layer_first`` pool: axis 0's stride is one block), token-major
    (``page_first``: a token's layers in one block) or one layer per 3 (blocks 128 apart)."""
    rows: Array
    if major == "layer":
        rows = np.full((layers, tokens, 8), fill, dtype=np.uint64).transpose(1, 0, 2)
    elif major == "token":
        rows = np.full((tokens, layers, 8), fill, dtype=np.uint64)
    else:
        gapped = np.full((layers, tokens, 3, 8), fill, dtype=np.uint64)
        rows = gapped[:, :, 1].transpose(1, 0, 2)
    return rows


@needs_stream
@pytest.mark.parametrize(
    ("dst_major", "src_major", "pieces"),
    [
        ("layer", "layer", [5 * 64] * 3 + [3 * 64] * 3 + [64] * 3),  # one piece per run and layer
        ("token", "layer", [64] * 27),  # destination blocks of 192 bytes: per token and layer
        ("layer", "token", [64] * 27),
        ("token", "token", [5 * 192, 3 * 192, 192]),  # whole units: one piece per run
        ("gapped", "layer", [64] * 27),  # axis 0's stride is not the block on one side
        ("layer", "gapped", [64] * 27),
    ],
)
def test_runs_of_units_that_continue_each_others_blocks_are_one_piece_per_block(
    dst_major: str, src_major: str, pieces: list[int]
) -> None:
    """Where axis 0's stride is the unit's block on both sides (the token rows of a
    ``layer_first`` pool), a run of n units is one piece of n blocks per block (a
    64-token run of 61 layers: 61 pieces, not 3904); elsewhere a piece per unit and
    block. Bit-exact against the run copies either way, neighbours untouched."""
    rng = np.random.default_rng(3)
    src = _token_rows(40, 3, src_major)
    src[:] = rng.integers(0, 1 << 62, src.shape, dtype=np.uint64)
    dst = _token_rows(30, 3, dst_major, fill=7)
    runs = [(2, 10, 5), (30, 0, 3), (39, 29, 1)]
    want = dst.copy()
    copy_slices(want, src, runs)
    ops = slice_ops(dst, src, runs)
    assert ops[:, 2].tolist() == pieces
    _stream.stream_each(ops)
    assert np.array_equal(dst, want)
    if dst_major == "gapped":  # the bytes between the destination's blocks stay as they were
        assert (np.asarray(dst.base)[:, :, [0, 2]] == 7).all()


def test_the_piece_is_the_smaller_block_or_the_whole_run() -> None:
    """``piece_bytes``: the greatest common divisor of the two sides' blocks (80-byte rows
    apart against 1280-byte contiguous units, either way round), or a run's whole bytes
    where units continue each other's blocks; the slices key names it."""
    src = np.zeros((20, 16, 10), dtype=np.uint64)  # units of one 1280-byte block
    dst = np.zeros((12, 16, 3, 10), dtype=np.uint64)[:, :, 1]  # 16 blocks of 80 bytes
    assert piece_bytes(dst, src, 2) == piece_bytes(src, dst, 2) == 80
    rows = np.zeros((64, 128), dtype=np.uint64)  # 1 KiB rows back to back
    assert piece_bytes(rows[32:], rows[:32], 3) == 3 << 10
    assert slices_shape(rows[32:], rows[:32], [(0, 0, 4)]) == (4 << 10, "4KiB runs of 4KiB pieces")


# ------------------------------------------------- row gathers (``take`` steps)
def _rows_case(seed: int, n: int = 300, shape: tuple[int, ...] = (1, 576)) -> tuple[Array, ...]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 1 << 16, (n, *shape), dtype=np.uint16)
    dst = rng.integers(0, 1 << 16, (n + 50, *shape), dtype=np.uint16)
    s_rows = rng.integers(0, n, 200)  # sources may repeat
    d_rows = rng.permutation(n + 50)[:200]  # destinations distinct
    return dst, src, d_rows, s_rows


@needs_stream
@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "strided rows"])
def test_rows_ops_moves_what_a_take_and_scatter_moves(transposed: bool) -> None:
    dst, src, d_rows, s_rows = _rows_case(1, shape=(4, 96))
    if transposed:  # each destination row is 4 blocks of 192 bytes, 2 blocks apart
        dst = np.repeat(dst, 2, axis=1)[:, ::2]
    want = dst.copy()
    want[d_rows] = src[s_rows]
    table = _stream_table.rows_ops(dst, src, d_rows, s_rows)
    assert table.shape == ((200 * 4, 3) if transposed else (200, 3))
    _stream.stream_each(table)
    assert np.array_equal(dst, want)  # the rows gathered, every other row untouched


def _page1_pools(layers: int, seed: int) -> tuple[Any, Any, Any, torch.Tensor, torch.Tensor]:
    """Two MLA page-1 device pools (the first filled), a ``layer_first`` host pool, and
    900 random host slots and device rows."""
    backend = sgl_core.TorchBackend()
    kw = dict(size=1024, page_size=1, dtype=torch.bfloat16, kv_lora_rank=512)
    dev = backend.create_device_pool(qk_rope_head_dim=64, layer_num=layers, **kw)  # type: ignore[arg-type]
    back = backend.create_device_pool(qk_rope_head_dim=64, layer_num=layers, **kw)  # type: ignore[arg-type]
    fill_device_random(dev, seed)
    host = backend.create_host_pool(dev, layout="layer_first")
    g = torch.Generator().manual_seed(seed)
    h_idx = torch.randperm(host.size, generator=g)[:900]
    d_idx = torch.randperm(1023, generator=g)[:900] + 1
    return dev, back, host, h_idx, d_idx


def _page1_load(monkeypatch: pytest.MonkeyPatch, costs: dict[str, float]) -> list[str]:
    """A page-1 ``layer_first`` load (1152-byte rows gathered from random host slots)
    through the pools, with ``costs`` on the fake clock; the ``take`` key's candidates."""
    _spy(monkeypatch, costs)
    dev, back, host, h_idx, d_idx = _page1_pools(2, 3)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    for layer in range(2):
        host.load_to_device_per_layer(back, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(back, layer, d_idx), device_rows(dev, layer, d_idx))
    (take,) = [c for c in copy_calibration() if c.key.startswith("take ")]
    return [take.choice, *take.seconds]


@needs_stream
@pytest.mark.parametrize(("stream_cost", "chosen"), [(1.0, "1"), (0.9, "stream1")])
def test_a_row_gather_load_takes_the_streaming_copy_when_faster(
    monkeypatch: pytest.MonkeyPatch, stream_cost: float, chosen: str
) -> None:
    """Page-1 loads gather rows (``take_rows``: into a staging buffer, then a scatter);
    the streaming copy moves each row once, and wins when faster on as many threads (a
    tie keeps the take); bit-exact."""
    got = _page1_load(monkeypatch, {"take_rows": 1.0, "stream_each": stream_cost})
    assert got == [chosen, "1", "2", "stream1", "stream2"]


def test_row_gathers_offer_no_streaming_copy_where_it_may_not_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Off (``SGLCORE_STREAM_COPY=0``): the take counts only. And rows the streaming copy
    may not move (other items, pieces under 64 bytes, shared memory) get no builder."""
    monkeypatch.setenv(_stream.ENV_VAR, "0")
    monkeypatch.setattr(_stream, "_loaded", None)
    got = _page1_load(monkeypatch, {"take_rows": 1.0, "stream_each": 0.01})
    assert got == ["1", "1", "2"]
    idx = torch.arange(4)
    rows = torch.zeros(8, 1, 64, dtype=torch.int16)
    assert _stream_table.rows_table(torch.zeros(8, 1, 64, dtype=torch.int16), rows, idx, idx)
    assert (
        _stream_table.rows_table(torch.zeros(8, 1, 64, dtype=torch.float32), rows, idx, idx) is None
    )
    small = torch.zeros(8, 1, 16, dtype=torch.int16)  # 32-byte rows
    assert _stream_table.rows_table(torch.zeros_like(small), small, idx, idx) is None
    assert _stream_table.rows_table(rows[2:], rows[:6], idx, idx) is None  # they overlap


def test_rows_ops_refuses_index_arrays_that_do_not_pair() -> None:
    dst, src, d_rows, s_rows = _rows_case(2)
    pairs = [(d_rows, s_rows[:1]), (d_rows[:5], s_rows[:6]), (d_rows[:4, None], s_rows[:4, None])]
    before = dst.copy()
    for d, s in pairs:
        with pytest.raises(ValueError, match="row index arrays"):
            _stream_table.rows_ops(dst, src, d, s)
    assert np.array_equal(dst, before)  # refused before any table, let alone a copy


def test_the_row_table_leaves_the_callers_indices_resizable() -> None:
    rows = torch.zeros(8, 1, 64, dtype=torch.int16)
    d_idx, s_idx = torch.arange(4), torch.arange(4, 8)
    build = _stream_table.rows_table(torch.zeros_like(rows), rows, d_idx, s_idx)
    assert build is not None
    table = build(slice(None))
    assert table.shape == (4, 3)
    for idx in (d_idx, s_idx):
        idx.resize_(100)  # Tensor.numpy() would have made this storage unresizable


@needs_stream
def test_a_chosen_row_gather_step_copies_strided_offset_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gather_step`` under AUTO with the streaming copy measured faster: rows every
    other row of a buffer, at an offset, gathered into a fresh destination (the
    measurement ran every candidate, so the destination is reset before the chosen
    step runs again); every other destination row keeps its bytes."""
    _spy(monkeypatch, {"take_rows": 1.0, "stream_each": 0.1})
    g = torch.Generator().manual_seed(9)
    base = torch.randint(-(1 << 15), 1 << 15, (1601, 1, 576), generator=g, dtype=torch.int16)
    src = base[1::2]  # 800 rows of 1152 bytes, 2304 bytes apart, starting one row in
    dst = torch.randint(-(1 << 15), 1 << 15, (1000, 1, 576), generator=g, dtype=torch.int16)
    s_idx = torch.randint(0, 800, (700,), generator=g)
    d_idx = torch.randperm(1000, generator=g)[:700]
    staging = torch.empty(700, 1, 576, dtype=torch.int16)
    step = _steps.gather_step(dst, src, d_idx, s_idx, staging, -1)
    assert step.fn is vars(_steps)["stream_each"]  # the spy: the streaming copy was chosen
    dst.fill_(7)
    step.run()
    want = torch.full_like(dst, 7)
    want[d_idx] = src[s_idx]
    assert torch.equal(dst, want)


@needs_stream
def test_rows_the_streaming_copy_may_not_move_are_gathered_by_take_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """32-byte rows (under the streaming stores' 64): the measured candidates are the take
    counts alone, and the chosen step gathers the rows."""
    _spy(monkeypatch, {"take_rows": 1.0, "stream_each": 0.1})
    src = torch.arange(600 * 16, dtype=torch.int16).view(600, 1, 16)
    dst = torch.zeros(700, 1, 16, dtype=torch.int16)
    s_idx, d_idx = torch.arange(599, -1, -1), torch.randperm(700)[:600]
    step = _steps.gather_step(
        dst, src, d_idx, s_idx, torch.empty(600, 1, 16, dtype=torch.int16), -1
    )
    (take,) = copy_calibration()
    assert list(take.seconds) == ["1", "2"] and step.fn is vars(_steps)["take_rows"]
    dst.zero_()
    step.run()
    want = torch.zeros_like(dst)
    want[d_idx] = src[s_idx]
    assert torch.equal(dst, want)


@needs_stream
def test_a_page_1_backup_by_the_streaming_copy_round_trips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page-1 backup's row gather (``gather cpu->cpu 1KiB rows``) with ``stream2``
    chosen: every row of every layer streamed, then loaded back bit-exact."""
    ticks = iter(range(10**6))
    cal = Calibrator(timer=lambda: float(next(ticks)), budget_s=1e9)
    monkeypatch.setattr(_calibrate, "_default", cal)
    names = ["1", "2", "0", "stream1", "stream2"]
    key = "gather cpu->cpu 1KiB rows"
    choice = _calibrate.CopyChoice(key, "stream2", dict.fromkeys(names, 1.0), 1, "", "")
    cal._choices[key] = choice
    calls: list[int] = []
    real = _stream.stream_each

    def spy(ops: Any) -> None:
        calls.append(len(ops))
        real(ops)

    monkeypatch.setattr(_stream, "stream_each", spy)
    dev, back, host, h_idx, d_idx = _page1_pools(3, 8)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    assert sum(calls) == 3 * 900  # the backup: every row of every layer, streamed
    for layer in range(3):
        host.load_to_device_per_layer(back, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(back, layer, d_idx), device_rows(dev, layer, d_idx))
