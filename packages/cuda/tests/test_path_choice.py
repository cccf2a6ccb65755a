"""The measured CUDA copy path (``SGL_CUDA_DIRECT_COPY=auto``, issue #27).

The choice itself is driven by a fake clock and fake candidates (no timed
assertion anywhere); the real candidates run on CPU pools under Triton's
interpreter and are checked for their bytes and for what was recorded. The
GB/s a GPU reaches, and which candidate wins there, wait for a GPU run
(``scripts/gpu_check.sh`` records ``copy_calibration`` in its JSON).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import sgl_cuda
from sgl_core.backend import Calibrator, CopyTuning
from sgl_core.errors import ShapeMismatchError
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_cuda import _direct_mover, kvcacheio
from sgl_cuda._direct_mover import CudaDirectMover
from sgl_cuda._path_choice import CANDIDATES, PathChooser, path_key, size_class

PS = 4
CPU = torch.device("cpu")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake(clock: FakeClock, cost: float | Callable[[], float], log: list[str], name: str,
         declines: bool = False) -> Callable[[], bool]:  # fmt: skip
    """A candidate that takes ``cost`` seconds on ``clock`` (or declines, taking none)."""

    def run() -> bool:
        log.append(name)
        if declines:
            return False
        clock.now += cost() if callable(cost) else cost
        return True

    return run


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def chooser(clock: FakeClock, **kw: Any) -> PathChooser:
    return PathChooser(Calibrator(timer=clock, budget_s=100, min_interval_s=0, **kw))


# ------------------------------------------------------------ the chooser
def test_the_fastest_candidate_moves_the_transfer_and_the_choice_is_recorded(
    clock: FakeClock,
) -> None:
    log: list[str] = []
    ch = chooser(clock)
    cands = {
        "copy engine": fake(clock, 4.0, log, "copy engine"),
        "batched copy engine": fake(clock, 1.0, log, "batched copy engine"),
        "kernel": fake(clock, 2.0, log, "kernel"),
    }
    assert ch.run("k", cands, 10, CPU) == "batched copy engine"
    (choice,) = ch.calibrator.choices()
    assert choice.key == "k" and choice.choice == "batched copy engine"
    assert set(choice.seconds) == set(cands) and choice.source == "measured"
    log.clear()
    assert ch.run("k", cands, 10, CPU) == "batched copy engine"  # known: not measured again
    assert log == ["batched copy engine"]


def test_a_declining_candidate_drops_out_and_is_never_timed(clock: FakeClock) -> None:
    log: list[str] = []
    ch = chooser(clock)
    cands = {
        "copy engine": fake(clock, 3.5, log, "copy engine"),
        "batched copy engine": fake(clock, 0.0, log, "batched copy engine", declines=True),
        "kernel": fake(clock, 3.0, log, "kernel"),
    }
    assert ch.run("k", cands, 10, CPU) == "copy engine"  # kernel within the 25% margin
    assert log.count("batched copy engine") == 1  # the probe, nothing more
    assert set(ch.calibrator.choices()[0].seconds) == {"copy engine", "kernel"}


def test_the_first_candidate_must_not_decline(clock: FakeClock) -> None:
    log: list[str] = []
    cands = {
        "copy engine": fake(clock, 1.0, log, "copy engine", declines=True),
        "kernel": fake(clock, 1.0, log, "kernel"),
    }
    with pytest.raises(RuntimeError, match="first copy candidate"):
        chooser(clock).run("k", cands, 10, CPU)


def test_a_chosen_candidate_that_declines_later_hands_the_call_to_the_first(
    clock: FakeClock,
) -> None:
    log: list[str] = []
    ch = chooser(clock)
    state = {"off": False}

    def batched() -> bool:
        log.append("batched")
        if state["off"]:
            return False  # e.g. switched off after a runtime error
        clock.now += 1.0
        return True

    cands = {"copy engine": fake(clock, 4.0, log, "copy engine"), "batched copy engine": batched}
    assert ch.run("k", cands, 10, CPU) == "batched copy engine"
    state["off"] = True
    log.clear()
    assert ch.run("k", cands, 10, CPU) == "copy engine"
    assert log == ["batched", "copy engine"]


def test_a_choice_this_call_cannot_offer_is_measured_again(clock: FakeClock) -> None:
    """E.g. the kernel won for a pool, and another pool of the key has unpinned memory."""
    log: list[str] = []
    ch = chooser(clock)
    both = {"copy engine": fake(clock, 4.0, log, "ce"), "kernel": fake(clock, 1.0, log, "k")}
    assert ch.run("k", both, 10, CPU) == "kernel"
    only = {"copy engine": fake(clock, 4.0, log, "ce"), "gather": fake(clock, 2.0, log, "g")}
    assert ch.run("k", only, 10, CPU) == "gather"
    assert ch.calibrator.current("k") == "gather"


def test_a_sample_is_measured_and_the_chosen_one_moves_the_whole(clock: FakeClock) -> None:
    log: list[str] = []
    ch = chooser(clock)
    whole = {
        "copy engine": fake(clock, 9.0, log, "whole ce"),
        "kernel": fake(clock, 9.0, log, "whole k"),
    }
    part = {
        "copy engine": fake(clock, 2.0, log, "part ce"),
        "kernel": fake(clock, 1.0, log, "part k"),
    }
    assert ch.run("k", whole, 100, CPU, sample=lambda: (part, 10)) == "kernel"
    assert [n for n in log if n.startswith("whole")] == ["whole k"]  # once, after choosing
    assert ch.calibrator.choices()[0].nbytes == 10


def test_a_sustained_drop_re_measures_the_key(clock: FakeClock) -> None:
    log: list[str] = []
    ch = chooser(clock, strikes=2)
    cost = {"copy engine": 2.0, "kernel": 1.0}
    cands = {n: fake(clock, lambda n=n: cost[n], log, n) for n in cost}  # type: ignore[misc]
    assert ch.run("k", cands, 1_000_000_000, CPU) == "kernel"
    cost["kernel"] = 16.0  # the kernel now runs 16x slower (e.g. SMs busy with compute)
    assert ch.run("k", cands, 1_000_000_000, CPU) == "kernel"  # strike 1
    assert ch.run("k", cands, 1_000_000_000, CPU) == "kernel"  # strike 2: stale
    assert ch.calibrator.current("k") is None
    assert ch.run("k", cands, 1_000_000_000, CPU) == "copy engine"
    (choice,) = ch.calibrator.choices()
    assert choice.source == "re-measured" and "observed" in choice.reason


def test_one_slow_copy_is_not_a_sustained_drop(clock: FakeClock) -> None:
    log: list[str] = []
    ch = chooser(clock, strikes=2)
    cost = {"copy engine": 2.0, "kernel": 1.0}
    cands = {n: fake(clock, lambda n=n: cost[n], log, n) for n in cost}  # type: ignore[misc]
    ch.run("k", cands, 1_000_000_000, CPU)
    for slow in (8.0, 1.0, 8.0, 1.0):
        cost["kernel"] = slow
        ch.run("k", cands, 1_000_000_000, CPU)
    assert ch.calibrator.current("k") == "kernel"


def test_keys_name_the_operation_device_pair_layout_parts_and_size_class() -> None:
    assert size_class(70_000) == "64KiB" and size_class(700) == "512B"
    dev = torch.device("cpu")  # the interpreter's pools; a GPU key names the GPU
    key = path_key("load", CPU, dev, "layer_first", "kv", 4096)
    assert key == "cuda load cpu->cpu layer_first [kv] 4KiB runs"
    key = path_key("backup", CPU, torch.device("meta"), "page_first_direct", "k,v", 512)
    assert key == "cuda backup meta->cpu page_first_direct [k,v] 512B runs"


def test_an_indexer_pool_has_keys_of_its_own(fresh: FakeClock) -> None:
    round_trip(mla, "layer_first")
    round_trip(lambda: mla(index_head_dim=16, indexer_layer_ids=(1,)), "layer_first")
    keys = sorted(c.key for c in calibration())
    assert len(keys) == 4 and sum("[kv,index_k]" in k for k in keys) == 2, keys


# ------------------------------------------------------ the real candidates
def mla(**kw: Any) -> Any:
    return sgl_cuda.backend.create_device_pool(
        size=8 * PS, page_size=PS, dtype=torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=8,
        layer_num=2, device="cpu", **kw,
    )  # fmt: skip


def mha() -> Any:
    return sgl_cuda.backend.create_mha_device_pool(
        size=8 * PS, page_size=PS, dtype=torch.bfloat16, head_num=2, head_dim=8,
        layer_num=2, device="cpu",
    )  # fmt: skip


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """``auto`` on; the movers' chooser on a fresh calibrator whose clock ticks once a read."""
    clock = FakeClock()

    def tick() -> float:
        clock.now += 1.0
        return clock.now

    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "auto")
    monkeypatch.setattr(
        CudaDirectMover, "chooser", PathChooser(Calibrator(timer=tick, budget_s=1e9))
    )
    return clock


def calibration() -> list[Any]:
    return CudaDirectMover.chooser.calibrator.choices()


def round_trip(make: Callable[[], Any], layout: str, tuning: CopyTuning | None = None) -> Any:
    backend = sgl_cuda.CudaBackend(tuning=tuning)
    src = make()
    fill_device_random(src, 3)
    host = backend.create_host_pool(src, layout=layout, io_backend="direct")
    h_idx, d_idx = page_indices([5, 1, 6, 2], PS), page_indices([1, 2, 7, 3], PS)
    host.backup_from_device_all_layer(src, h_idx, d_idx, "direct")
    dst = make()
    for layer in range(src.layer_num):
        host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(src, layer, d_idx))
    return src, dst, d_idx


@pytest.mark.parametrize(
    ("make", "layout", "measured"),
    [
        (mla, "layer_first", {"copy engine", "copy engine gather", "kernel"}),
        (mha, "layer_first", {"copy engine", "copy engine gather", "kernel"}),
        (mla, "page_first_direct", {"copy engine", "copy engine gather"}),
        (mha, "page_first_direct", {"copy engine", "copy engine gather"}),
    ],
)
def test_auto_measures_the_real_candidates_that_can_move_the_rows(
    fresh: FakeClock, make: Callable[[], Any], layout: str, measured: set[str]
) -> None:
    """No batched copies without CUDA 12.8 (it declines); no kernel for page_first_direct."""
    round_trip(make, layout)
    choices = calibration()
    assert {c.key.split()[1] for c in choices} == {"backup", "load"}
    assert all(layout in c.key for c in choices)
    for c in choices:
        assert set(c.seconds) == measured
        assert c.choice == "copy engine"  # equal ticks: the preferred one


def test_auto_moves_dsa_indexer_rows_with_every_candidate(fresh: FakeClock) -> None:
    src, dst, d_idx = round_trip(
        lambda: mla(index_head_dim=16, indexer_layer_ids=(1,), with_index_k_scale=True),
        "layer_first",
    )
    assert all("kernel" in c.seconds for c in calibration())
    assert torch.equal(dst.index_k_buffer[0][d_idx], src.index_k_buffer[0][d_idx])
    # bytes, not floats: random bits in a float32 scale can be a NaN (NaN != NaN)
    assert torch.equal(dst.index_k_scale_buffer[0][d_idx].view(torch.uint8),
                       src.index_k_scale_buffer[0][d_idx].view(torch.uint8))  # fmt: skip


@pytest.mark.parametrize(
    ("winner", "layout"),
    [
        ("copy engine", "layer_first"),
        ("copy engine gather", "layer_first"),
        ("kernel", "layer_first"),
        ("copy engine", "page_first_direct"),
        ("copy engine gather", "page_first_direct"),
    ],
)
def test_each_chosen_candidate_moves_exact_bytes(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch, winner: str, layout: str
) -> None:
    """Scripted costs make ``winner`` the choice; the next transfers run it alone, exactly."""
    clock = FakeClock()
    monkeypatch.setattr(
        CudaDirectMover, "chooser", PathChooser(Calibrator(timer=clock, budget_s=1e9))
    )
    real = CudaDirectMover._candidates
    ran: list[str] = []

    def scripted(self: CudaDirectMover, transfer: Any, *rest: Any) -> dict[str, Any]:
        def timed(name: str, cand: Callable[[], bool]) -> Callable[[], bool]:
            def run() -> bool:
                ran.append(name)
                moved = cand()
                clock.now += 1.0 if name == winner else 10.0
                return moved

            return run

        return {n: timed(n, c) for n, c in real(self, transfer, *rest).items()}

    monkeypatch.setattr(CudaDirectMover, "_candidates", scripted)
    round_trip(mla, layout)  # measures backup and load
    assert {c.choice for c in calibration()} == {winner}
    ran.clear()
    src, dst, d_idx = round_trip(mla, layout)  # fresh pools: only the winner writes them
    assert set(ran) == {winner}
    for layer in range(2):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(src, layer, d_idx))


def test_thresholds_are_measured_per_size_class(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gather wins on short runs, slices on long ones: the path changes between size classes."""
    clock = FakeClock()
    monkeypatch.setattr(
        CudaDirectMover, "chooser", PathChooser(Calibrator(timer=clock, budget_s=1e9))
    )
    real = CudaDirectMover._candidates

    def scripted(self: CudaDirectMover, transfer: Any, *rest: Any) -> dict[str, Any]:
        short = transfer.count <= PS  # one page: short runs in this test
        fast = "copy engine gather" if short else "copy engine"

        def timed(name: str, cand: Callable[[], bool]) -> Callable[[], bool]:
            def run() -> bool:
                moved = cand()
                clock.now += 1.0 if name == fast else 10.0
                return moved

            return run

        return {n: timed(n, c) for n, c in real(self, transfer, *rest).items()}

    monkeypatch.setattr(CudaDirectMover, "_candidates", scripted)
    src = mla()
    fill_device_random(src, 4)
    host = sgl_cuda.backend.create_host_pool(src, layout="layer_first", io_backend="direct")
    one = page_indices([3], PS)
    run = page_indices([0, 1, 2, 3, 4, 5, 6], PS)  # one run of 7 pages
    host.backup_from_device_all_layer(src, one, one, "direct")
    host.backup_from_device_all_layer(src, run, run, "direct")
    by_class = {c.key: c.choice for c in calibration()}
    assert len(by_class) == 2
    assert sorted(by_class.values()) == ["copy engine", "copy engine gather"]
    short_key = next(k for k in by_class if f" {size_class(PS * 48)} " in k)  # 48-byte rows
    assert by_class[short_key] == "copy engine gather"


def test_an_explicit_tuning_or_mode_wins_over_auto(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    round_trip(mla, "layer_first", tuning=CopyTuning())
    assert calibration() == []
    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "foreach")
    round_trip(mla, "layer_first")
    assert calibration() == []
    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "auto")
    round_trip(mla, "layer_first")
    assert calibration() != []


def test_a_big_transfer_is_measured_on_a_sample(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_direct_mover, "SAMPLE_BYTES", 2 * PS * 48 * 2)  # two pages of 2 layers
    counts: list[int] = []
    real = CudaDirectMover._candidates

    def seen(self: CudaDirectMover, transfer: Any, *rest: Any) -> dict[str, Any]:
        counts.append(transfer.count)
        return real(self, transfer, *rest)

    monkeypatch.setattr(CudaDirectMover, "_candidates", seen)
    src = mla()
    fill_device_random(src, 5)
    host = sgl_cuda.backend.create_host_pool(src, layout="layer_first", io_backend="direct")
    idx = page_indices([0, 2, 4, 6], PS)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    # 4 pages x 2 layers of 48-byte rows is twice the sample: measured on 2 whole pages
    assert sorted(counts) == [2 * PS, 4 * PS]
    (choice,) = calibration()
    assert choice.nbytes == 2 * PS * 48 * 2
    dst = mla()
    host.load_to_device_per_layer(dst, idx, idx, 0, "direct")
    assert torch.equal(device_rows(dst, 0, idx), device_rows(src, 0, idx))


def test_kvcacheio_direct_functions_do_not_take_auto() -> None:
    layers = [torch.zeros(4, 1, 8)]
    idx = torch.arange(4)
    with pytest.raises(ShapeMismatchError, match="mode"):
        kvcacheio.transfer_kv_direct(layers, layers, idx, idx, 1, mode="auto")


def test_candidate_names_in_preference_order() -> None:
    assert CANDIDATES[0] == "copy engine" and CANDIDATES[-1] == "kernel"


def test_auto_plans_a_load_once_per_transfer(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run size (an index read-back) and the kernel check: once per validated transfer."""
    planned: list[int] = []
    real = CudaDirectMover._auto_plan

    def counting(self: CudaDirectMover, transfer: Any) -> Any:
        planned.append(transfer.count)
        return real(self, transfer)

    monkeypatch.setattr(CudaDirectMover, "_auto_plan", counting)
    src = mla()
    fill_device_random(src, 6)
    host = sgl_cuda.backend.create_host_pool(src, layout="layer_first", io_backend="direct")
    idx = page_indices([1, 3], PS)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    assert len(planned) == 1
    dst = mla()
    for layer in (0, 1, 0, 1):
        host.load_to_device_per_layer(dst, idx, idx, layer, "direct")
    assert len(planned) == 2
    host.backup_from_device_all_layer(src, idx, idx, "direct")  # a backup plans afresh
    host.load_to_device_per_layer(dst, idx, idx, 1, "direct")  # the loads' plan stays
    assert len(planned) == 3
    for layer in (0, 1):
        assert torch.equal(device_rows(dst, layer, idx), device_rows(src, layer, idx))


@pytest.mark.parametrize("make", [mla, mha], ids=["mla", "mha"])
def test_the_batched_candidate_moves_exact_bytes_where_it_runs(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch, make: Callable[[], Any]
) -> None:
    """The batch's real address arrays, replayed by ``memmove`` on the CPU buffers (a
    stand-in for ``cudaMemcpyBatchAsync``): scripted to win, it alone moves exact bytes."""
    import ctypes

    from sgl_cuda import _copy_engine

    issued: list[int] = []

    def replay(pieces: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *a: Any) -> None:
        src, dst, size = pieces
        issued.append(size.numel())
        for s, d, n in zip(src.tolist(), dst.tolist(), size.tolist(), strict=True):
            ctypes.memmove(d, s, n)

    monkeypatch.setattr(_copy_engine, "available", lambda: True)
    monkeypatch.setattr(_copy_engine, "device_of", lambda tensors: CPU)
    monkeypatch.setattr(_copy_engine, "_issue", replay)
    clock = FakeClock()
    monkeypatch.setattr(
        CudaDirectMover, "chooser", PathChooser(Calibrator(timer=clock, budget_s=1e9))
    )
    real = CudaDirectMover._candidates

    def scripted(self: CudaDirectMover, transfer: Any, *rest: Any) -> dict[str, Any]:
        def timed(name: str, cand: Callable[[], bool]) -> Callable[[], bool]:
            def run() -> bool:
                moved = cand()
                clock.now += 1.0 if name == "batched copy engine" else 10.0
                return moved

            return run

        return {n: timed(n, c) for n, c in real(self, transfer, *rest).items()}

    monkeypatch.setattr(CudaDirectMover, "_candidates", scripted)
    round_trip(make, "layer_first")
    assert {c.choice for c in calibration()} == {"batched copy engine"}
    issued.clear()
    src, dst, d_idx = round_trip(make, "layer_first")  # only the batch writes these pools
    assert len(issued) == 3  # one backup, two layer loads
    for layer in range(2):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(src, layer, d_idx))
    # rows on a layer subset: the batch declines (it would address slots as layers)
    issued.clear()
    dsa = lambda: mla(index_head_dim=16, indexer_layer_ids=(1,), with_index_k_scale=True)  # noqa: E731
    round_trip(dsa, "layer_first")
    assert issued == []


def test_a_choice_is_kept_on_disk_for_the_next_process(tmp_path: Any, clock: FakeClock) -> None:
    """The core calibrator's cache file (``SGLCORE_COPY_CALIBRATION``) keeps cuda keys too."""
    from sgl_core.transfer.copy._calibrate import DiskCache

    path = tmp_path / "cal.json"
    log: list[str] = []
    first = PathChooser(Calibrator(timer=clock, budget_s=100, cache=DiskCache(path)))
    cands = {"copy engine": fake(clock, 4.0, log, "ce"), "kernel": fake(clock, 1.0, log, "k")}
    key = path_key("load", CPU, CPU, "layer_first", "kv", 4096)
    assert first.run(key, cands, 10, CPU) == "kernel"
    log.clear()
    later = PathChooser(Calibrator(timer=clock, budget_s=100, cache=DiskCache(path)))
    assert later.run(key, cands, 10, CPU) == "kernel"
    assert log == ["k"]  # not measured again
    (choice,) = later.calibrator.choices()
    assert choice.source == "disk cache"


def test_the_kernel_declines_a_device_pool_kernel_io_would_refuse(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E.g. unpinned host memory on a GPU: the kernel is not offered, the rest still move."""
    from sgl_core.errors import UnsupportedLayoutError
    from sgl_cuda._movers import KernelMover

    def refuse(self: KernelMover, device_pool: Any) -> None:
        raise UnsupportedLayoutError("io_backend='kernel' needs pinned host memory (test)")

    monkeypatch.setattr(KernelMover, "check", refuse)
    round_trip(mla, "layer_first")
    assert calibration() and all("kernel" not in c.seconds for c in calibration())


def test_a_page_granular_sample_is_whole_pages(
    fresh: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_direct_mover, "SAMPLE_BYTES", 3 * 48 * 2)  # 1.5 tokens' worth x 2 layers
    counts: list[int] = []
    real = CudaDirectMover._candidates

    def seen(self: CudaDirectMover, transfer: Any, *rest: Any) -> dict[str, Any]:
        counts.append(transfer.count)
        return real(self, transfer, *rest)

    monkeypatch.setattr(CudaDirectMover, "_candidates", seen)
    src = mla()
    fill_device_random(src, 7)
    host = sgl_cuda.backend.create_host_pool(src, layout="page_first_direct", io_backend="direct")
    idx = page_indices([0, 2, 4], PS)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    assert sorted(counts) == [PS, 3 * PS]  # one whole page, not 3 tokens
    dst = mla()
    host.load_to_device_per_layer(dst, idx, idx, 1, "direct")
    assert torch.equal(device_rows(dst, 1, idx), device_rows(src, 1, idx))
