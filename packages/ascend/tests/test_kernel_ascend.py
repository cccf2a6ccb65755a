"""kernel_ascend copy planning: merged runs, batched blocks, gather path, per-layer load."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import sgl_ascend
from sgl_ascend import AscendMLADevicePool, AscendMLAHostPool, _transfer
from sgl_ascend._backend import AscendBackend
from sgl_core.backend import CopyTuning, RunSide, copy_runs
from sgl_core.errors import (
    LayerIndexError,
    PageAlignmentError,
    PoolMismatchError,
    UnsupportedLayoutError,
)
from sgl_core.testing import page_indices, random_bits

PS = 4
LAYERS = 5
IO = "kernel_ascend"


def pools(
    seed: int, tuning: CopyTuning | None = None
) -> tuple[AscendMLADevicePool, AscendMLAHostPool]:
    dev = sgl_ascend.backend.create_device_pool(
        size=12 * PS,
        page_size=PS,
        dtype=torch.float16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
        index_head_dim=4,
        indexer_layer_ids=[1, 3],
        with_index_k_scale=True,
    )
    gen = torch.Generator().manual_seed(seed)
    for buf in dev.components:
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))
    host = AscendBackend(tuning=tuning).create_host_pool(dev, layout="page_first_kv_split")
    return dev, host


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def expected_backup(
    host: AscendMLAHostPool, dev: AscendMLADevicePool, hp: list[int], dp: list[int]
) -> list[torch.Tensor]:
    """Oracle: a per-page Python loop over every component."""
    out = [b.clone() for b in host.buffers]
    for h, d in zip(hp, dp, strict=True):
        for o, src in zip(out, dev.components, strict=True):
            o[h] = src[:, d]
    return out


def test_plan_merges_runs_consecutive_on_both_sides() -> None:
    hp = [4, 5, 6, 9, 10, 0]
    dp = [1, 2, 3, 7, 8, 11]
    plan = _transfer.plan_pages(page_indices(hp, PS), page_indices(dp, PS), PS)
    assert plan.host_pages.tolist() == hp
    assert plan.device_pages.tolist() == dp
    assert list(plan.runs) == [(4, 1, 3), (9, 7, 2), (0, 11, 1)]


@pytest.mark.parametrize("short_run_bytes", [0, 1 << 40], ids=["strided-runs", "gather"])
def test_backup_and_load_match_per_page_oracle(short_run_bytes: int) -> None:
    dev, host = pools(0, CopyTuning(gather_below_page_run_bytes=short_run_bytes))
    hp = [20, 21, 22, 3, 11, 12]
    dp = [5, 6, 7, 0, 12, 2]
    expect = expected_backup(host, dev, hp, dp)
    host.backup_from_device_all_layer(dev, page_indices(hp, PS), page_indices(dp, PS), IO)
    for got, want in zip(host.buffers, expect, strict=True):
        assert torch.equal(as_bytes(got), as_bytes(want))
    dst, _ = pools(1)
    for layer in range(LAYERS):
        before = [b.clone() for b in dst.components]
        host.load_to_device_per_layer(dst, page_indices(hp, PS), page_indices(dp, PS), layer, IO)
        slot = dst.indexer_slot(layer)
        for comp, (now, old, src) in enumerate(
            zip(
                dst.components,
                before,
                dev.components,
                strict=True,
            )
        ):
            row = layer if comp < 2 else slot
            for r in range(now.shape[0]):
                if r != row:
                    assert torch.equal(as_bytes(now[r]), as_bytes(old[r])), (comp, r)
            if row is None:
                continue
            assert torch.equal(as_bytes(now[row, dp]), as_bytes(src[row, dp]))
            rest = [p for p in range(now.shape[1]) if p not in dp]
            assert torch.equal(as_bytes(now[row, rest]), as_bytes(old[row, rest]))


def test_copies_are_batched_per_run_not_per_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of many pages is one block per component, for every layer at once."""
    calls: list[list[tuple[int, ...]]] = []

    def record(
        runs: list[tuple[int, int, int]], pairs: list[tuple[RunSide, RunSide]], **kw: bool
    ) -> None:
        # (shape, bytes of the last dim) of each destination block: they may be wider ints.
        runs = list(runs)
        into_first = kw["into_first"]
        dst = [a.block(h, n) if into_first else b.block(d, n) for h, d, n in runs for a, b in pairs]
        calls.append([(*t.shape[:-1], t.shape[-1] * t.element_size()) for t in dst])
        copy_runs(runs, pairs, **kw)

    monkeypatch.setattr(_transfer, "copy_runs", record)
    # copy_threads 0: the torch run copies (other CPU backups: numpy slices, one per run)
    dev, host = pools(2, CopyTuning(gather_below_page_run_bytes=0, copy_threads=0))
    hp = [*list(range(8, 18)), 2]
    dp = [*list(range(1, 11)), 12]
    host.backup_from_device_all_layer(dev, page_indices(hp, PS), page_indices(dp, PS), IO)
    assert len(calls) == 1
    assert len(calls[0]) == 2 * 4
    assert calls[0][0] == (10, LAYERS, PS, 1, 16 * 2)
    # A per-layer load between CPU tensors: one slice-copy step per component, per run.
    steps: list[tuple[list[tuple[int, int, int]], tuple[int, ...]]] = []
    real_step = _transfer.slices_step

    def record_step(dst: Any, src: Any, runs: list[tuple[int, int, int]], *a: Any) -> Any:
        steps.append((list(runs), tuple(dst.shape[1:])))
        return real_step(dst, src, runs, *a)

    monkeypatch.setattr(_transfer, "slices_step", record_step)
    calls.clear()
    host.load_to_device_per_layer(dev, page_indices(hp, PS), page_indices(dp, PS), 0, IO)
    assert calls == []
    assert [r for r, _ in steps] == [[(8, 1, 10), (2, 12, 1)]] * 2
    assert all(shape[0] == PS for _, shape in steps)


def test_short_runs_use_one_gather_per_component(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_transfer, "copy_runs", lambda *a, **k: pytest.fail("per-run path"))
    dev, host = pools(3, CopyTuning(gather_below_page_run_bytes=1 << 40))
    hp, dp = [5, 1, 9, 3], [2, 8, 4, 0]
    host.backup_from_device_all_layer(dev, page_indices(hp, PS), page_indices(dp, PS), IO)
    for got, want in zip(host.buffers, expected_backup(host, dev, hp, dp), strict=True):
        assert torch.equal(as_bytes(got), as_bytes(want))


def test_single_run_uses_strided_copy_even_when_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    huge = CopyTuning(gather_below_page_run_bytes=1 << 40)
    plan = _transfer.plan_pages(page_indices([3, 4], PS), page_indices([0, 1], PS), PS)
    assert not _transfer._short_runs(plan, 1, huge)
    assert not _transfer._short_runs(plan, 1, CopyTuning())
    many = _transfer.plan_pages(page_indices([3, 1], PS), page_indices([0, 5], PS), PS)
    assert _transfer._short_runs(many, 1, huge)


def test_plan_reused_only_for_equal_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, host = pools(5)
    calls: list[int] = []
    real = _transfer.plan_pages

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_transfer, "plan_pages", counting)
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    for layer in range(LAYERS):
        host.load_to_device_per_layer(dev, h_idx, d_idx, layer, IO)
    assert len(calls) == 1  # one plan for all layers of the same indices
    # Keyed on identity (and version), not values: new tensors are validated and planned.
    h_new, d_new = h_idx.clone(), d_idx.clone()
    host.load_to_device_per_layer(dev, h_new, d_new, 0, IO)
    assert len(calls) == 2
    host.load_to_device_per_layer(dev, h_new, d_new, 1, IO)
    assert len(calls) == 2
    # A write torch's version counter cannot see (through numpy) is still caught on CPU.
    d_new.numpy()[:] = page_indices([7, 5], PS).numpy()
    host.load_to_device_per_layer(dev, h_new, d_new, 0, IO)
    assert len(calls) == 3
    assert torch.equal(as_bytes(dev.k_buffer[0, [7, 5]]), as_bytes(host.k_buffer[[1, 2], 0]))


def test_repeated_load_revalidates_whatever_changed() -> None:
    dev, host = pools(6)
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, IO)
    snapshot = [b.clone() for b in dev.components]
    with pytest.raises(LayerIndexError):
        host.load_to_device_per_layer(dev, h_idx, d_idx, LAYERS, IO)
    d_idx[:PS] += 29  # in place, now misaligned: must be caught although the object is the same
    with pytest.raises(PageAlignmentError):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, IO)
    d_idx[:PS] -= 29
    other = sgl_ascend.backend.create_device_pool(
        size=12 * PS, page_size=PS, dtype=torch.float16, kv_lora_rank=16,
        qk_rope_head_dim=8, layer_num=LAYERS,
    )  # fmt: skip
    with pytest.raises(PoolMismatchError):
        host.load_to_device_per_layer(other, h_idx, d_idx, 1, IO)
    with pytest.raises(UnsupportedLayoutError):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    for now, before in zip(dev.components, snapshot, strict=True):
        assert torch.equal(as_bytes(now), as_bytes(before))
    host.load_to_device_per_layer(dev, h_idx, d_idx, 3, IO)
    dev_ik, host_ik = dev.index_k_buffer, host.index_k_buffer
    assert dev_ik is not None
    assert host_ik is not None
    assert torch.equal(as_bytes(dev_ik[1, [3, 4]]), as_bytes(host_ik[[1, 2], 1]))


@pytest.mark.parametrize(("limit", "path"), [(None, "gather_step"), (1, "memmove_step")])
def test_cpu_load_gathers_only_pages_below_the_load_limit(
    monkeypatch: pytest.MonkeyPatch, limit: int | None, path: str
) -> None:
    """Short runs of pages under ``by_address_min_block_bytes``: a per-layer CPU load copies
    them by address from ``load_gather_below_run_bytes`` on, and gathers below it."""
    used: list[str] = []

    def recorded(name: str) -> Any:
        real = getattr(_transfer, name)

        def step(*a: Any) -> Any:
            used.append(name)
            return real(*a)

        return step

    for name in ("gather_step", "memmove_step"):
        monkeypatch.setattr(_transfer, name, recorded(name))
    src, host = pools(4, CopyTuning(load_gather_below_run_bytes=limit))
    hp, dp = [5, 1, 9, 3], [2, 8, 4, 0]
    host.backup_from_device_all_layer(src, page_indices(hp, PS), page_indices(dp, PS), IO)
    dst, _ = pools(5)
    host.load_to_device_per_layer(dst, page_indices(hp, PS), page_indices(dp, PS), 1, IO)
    assert used and set(used) == {path}
    rows = [1, 1, dst.indexer_slot(1), dst.indexer_slot(1)]
    for now, want, row in zip(dst.components, src.components, rows, strict=True):
        assert torch.equal(as_bytes(now[row, dp]), as_bytes(want[row, dp]))
