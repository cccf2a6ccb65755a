"""Calibration that sees what the real copies see (issue #27): cold samples of per-layer
load steps, the shape keys of slice copies, huge host pages.

No timed assertions: durations are scripted on a fake clock; the copies are checked
for their bytes and for what was asked of the calibrator and the kernel.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch

import sgl_core
from sgl_core.kv import _memory
from sgl_core.kv._memory import HOST_PAGE_BYTES, advise_huge_pages, cpu_zeros, page_aligned_zeros
from sgl_core.transfer.copy import _calibrate, _evict
from sgl_core.transfer.copy._calibrate import Calibrator
from sgl_core.transfer.copy._evict import evict_caches
from sgl_core.transfer.copy._steps import slices_step
from sgl_core.transfer.copy._tuning import AUTO


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def cost(self, seconds: float, calls: list[str], name: str) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            self.now += seconds

        return run


def test_cold_runs_before_every_candidate_call_and_is_not_charged_to_the_budget() -> None:
    clock, calls = Clock(), list[str]()
    cal = Calibrator(timer=clock, rounds=3, budget_s=2.0)
    cands = {"1": clock.cost(0.1, calls, "1"), "2": clock.cost(0.3, calls, "2")}
    # each eviction takes 100 s on this clock: charged to the budget, it would end the
    # measurement after the first timed round
    assert cal.choose("k", cands, 1, cold=clock.cost(100.0, calls, "cold")) == "1"
    assert calls == ["cold", "1", "cold", "2"] * 4  # the warm-up round, then 3 timed rounds
    (choice,) = cal.choices()
    assert choice.seconds == pytest.approx({"1": 0.1, "2": 0.3})  # cold time is not a sample


def test_without_cold_nothing_runs_between_candidates() -> None:
    clock, calls = Clock(), list[str]()
    cal = Calibrator(timer=clock, rounds=2, budget_s=10.0)
    cal.choose("k", {"a": clock.cost(0.1, calls, "a"), "b": clock.cost(0.1, calls, "b")}, 1)
    assert calls == ["a", "b"] * 3


def test_the_budget_still_counts_the_candidates_time() -> None:
    clock, calls = Clock(), list[str]()
    cal = Calibrator(timer=clock, rounds=5, budget_s=0.5)
    cal.choose("k", {"a": clock.cost(0.2, calls, "a"), "b": clock.cost(0.2, calls, "b")}, 1)
    assert calls == ["a", "b"] * 2  # warm-up (0.4 s) plus one timed round passes 0.5 s


class SpyCalibrator(Calibrator):
    def __init__(self) -> None:
        super().__init__(timer=Clock(), budget_s=1e9)
        self.asked: list[tuple[str, Callable[[], None] | None]] = []
        self.ranks: list[Mapping[str, int] | None] = []
        self.confirms: list[bool] = []

    def choose(
        self,
        key: str,
        candidates: Mapping[str, Callable[[], None]],
        nbytes: int,
        cold: Callable[[], None] | None = None,
        ranks: Mapping[str, int] | None = None,
        confirm: bool = False,
    ) -> str:
        self.asked.append((key, cold))
        self.ranks.append(ranks)
        self.confirms.append(confirm)
        return next(iter(candidates))


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> SpyCalibrator:
    cal = SpyCalibrator()
    monkeypatch.setattr(_calibrate, "_default", cal)
    return cal


def _rows(units: int, row: int, stride_rows: int = 1) -> np.ndarray:
    flat = np.arange(units * row * stride_rows, dtype=np.uint64)
    return flat.reshape(units * stride_rows, row)[::stride_rows]


def test_a_step_smaller_than_the_caches_is_measured_cold(spy: SpyCalibrator) -> None:
    src, dst = _rows(64, 4096), np.zeros((64, 4096), dtype=np.uint64)  # 2 MiB
    runs = [(i, 63 - i, 1) for i in range(64)]
    slices_step(dst, src, runs, (64, 64), AUTO).run()
    ((_, cold),) = spy.asked
    assert cold is evict_caches
    assert (dst[::-1] == src).all()
    (ranks,) = spy.ranks  # the candidates ranked by thread count
    assert spy.confirms == [True]  # a close sample is confirmed on the real loads
    assert ranks is not None and ranks["1"] == 1
    assert all(rank == int(name.removeprefix("stream")) for name, rank in ranks.items())


def test_a_step_bigger_than_the_scratch_buffer_is_not_evicted_first(
    spy: SpyCalibrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_evict, "scratch_bytes", lambda: 1 << 20)
    src, dst = _rows(64, 4096), np.zeros((64, 4096), dtype=np.uint64)
    slices_step(dst, src, [(0, 0, 64)], (64, 64), AUTO).run()
    ((_, cold),) = spy.asked
    assert cold is None


def test_slice_keys_tell_strided_rows_from_adjacent_ones(spy: SpyCalibrator) -> None:
    """page_first: 16-row runs of rows far apart; page_first_direct: runs of one block."""
    row = 128  # 1 KiB rows of uint64
    runs = [(16 * i, 16 * (63 - i), 16) for i in range(64)]  # 16-row runs, 1 MiB
    adjacent = _rows(1024, row)
    strided = _rows(1024, row, stride_rows=8)
    for src in (adjacent, strided):
        dst = np.zeros((1024, row), dtype=np.uint64)
        slices_step(dst, src, runs, (1024, 1024), AUTO).run()
        for a, b, n in runs:
            assert (dst[b : b + n] == src[a : a + n]).all()
    keys = [key for key, _ in spy.asked]
    assert keys == [
        "slices cpu->cpu 16KiB runs of 16KiB pieces, 1024KiB per load",
        "slices cpu->cpu 16KiB runs of 1KiB pieces, 1024KiB per load",
    ]


def test_a_strided_destination_also_makes_pieces_one_row() -> None:
    cal = SpyCalibrator()
    src, dst = _rows(1024, 128), np.zeros((2048, 128), dtype=np.uint64)[::2]
    old = _calibrate._default
    _calibrate._default = cal
    try:
        slices_step(dst, src, [(0, 0, 1024)], (1024, 1024), AUTO).run()
    finally:
        _calibrate._default = old
    assert (dst == src).all()
    assert cal.asked[0][0] == "slices cpu->cpu 1024KiB runs of 1KiB pieces, 1024KiB per load"


def test_evict_caches_writes_a_buffer_of_the_scratch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_evict, "_scratch", None)
    monkeypatch.setattr(_evict, "scratch_bytes", lambda: 3 << 20)
    evict_caches()
    buf = _evict._scratch
    assert buf is not None and buf.nbytes == 3 << 20 and (buf == 1).all()
    evict_caches()
    assert _evict._scratch is buf and (buf == 2).all()  # kept, and written again


def _cache(root: Path, index: int, size: str) -> None:
    (root / f"index{index}").mkdir()
    (root / f"index{index}" / "size").write_text(size + "\n", encoding="ascii")


def test_scratch_bytes_from_sysfs(tmp_path: Path) -> None:
    assert _evict.scratch_bytes(tmp_path) == 64 << 20  # none listed: 2 x 32 MiB
    _cache(tmp_path, 0, "48K")
    _cache(tmp_path, 2, "1024K")
    _cache(tmp_path, 3, "98304K")  # 96 MiB
    assert _evict.scratch_bytes(tmp_path) == 192 << 20
    _cache(tmp_path, 4, "512M")
    assert _evict.scratch_bytes(tmp_path) == 256 << 20  # at most 256 MiB
    bad = tmp_path / "bad"
    bad.mkdir()
    _cache(bad, 0, "lots")
    _cache(bad, 1, str(40 << 20))  # plain bytes
    assert _evict.scratch_bytes(bad) == 80 << 20


# ---------------------------------------------------------------- huge host pages


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte sizes of the tensors the pools ask huge pages for (nothing is asked)."""
    sizes: list[int] = []

    def spy(t: torch.Tensor) -> bool:
        sizes.append(t.numel() * t.element_size())
        return False

    monkeypatch.setattr(_memory, "advise_huge_pages", spy)
    return sizes


def test_host_and_cpu_device_buffers_ask_for_huge_pages_before_they_are_zeroed(
    advised: list[int],
) -> None:
    t = page_aligned_zeros((8 << 20,), torch.uint8)
    assert advised == [(8 << 20) + HOST_PAGE_BYTES]
    assert t.data_ptr() % HOST_PAGE_BYTES == 0 and not t.any()
    d = cpu_zeros((4, 1 << 20), torch.int16, "cpu")
    assert advised[1:] == [8 << 20] and not d.any()
    meta = cpu_zeros((4, 1 << 20), torch.int16, "meta")  # not CPU memory: not asked
    assert meta.device.type == "meta" and len(advised) == 2


def test_the_torch_backend_pools_ask_for_huge_pages(advised: list[int]) -> None:
    backend = sgl_core.get_backend("torch")
    dev = backend.create_device_pool(
        size=1024, page_size=16, dtype=torch.bfloat16, layer_num=4, kv_lora_rank=512,
        qk_rope_head_dim=64,
    )  # fmt: skip
    assert advised, "device rows"
    before = len(advised)
    host = backend.create_host_pool(dev, host_to_device_ratio=2.0, layout="page_first")
    assert len(advised) > before, "host buffers"
    assert all(not part.buffer.any() for part in host._parts)


def test_advise_is_off_with_the_variable_and_for_small_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big = torch.empty(8 << 20, dtype=torch.uint8)
    assert not advise_huge_pages(torch.empty(1 << 20, dtype=torch.uint8))
    monkeypatch.setenv("SGLCORE_HUGE_PAGES", "0")
    assert not advise_huge_pages(big)


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(),
    reason="no transparent huge pages in this kernel",
)
def test_advise_asks_the_kernel_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLCORE_HUGE_PAGES", raising=False)
    assert sys.platform.startswith("linux")
    big = torch.empty(8 << 20, dtype=torch.uint8)
    assert advise_huge_pages(big)
    big.fill_(7)
    assert bool((big == 7).all())  # advice changes no byte
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not advise_huge_pages(big)
