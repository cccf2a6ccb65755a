"""Copies cut below ATen's grain and spread over our own threads (issue #27), bit-exact.

Every new path (``copy_threads`` 1 and n: ``copy_pieces``, ``gather_pieces``,
threaded ``memmove_blocks``) is compared byte for byte with a plain
``copy_`` / index copy of the same data, on odd sizes, strided and transposed
blocks, blocks above the grain in one row, and overlapping source runs.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.backend import NEVER, CopyTuning
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_core.transfer.copy import _copy
from sgl_core.transfer.copy._auto_copy import gather_pieces
from sgl_core.transfer.copy._copy import (
    copy_blocks,
    copy_pieces,
    memmove_blocks,
    shutdown_copy_threads,
)
from sgl_core.transfer.copy._engine import RunSide, copy_runs, gather_rows
from sgl_core.transfer.copy._pieces import GRAIN, index_chunk, split_parts, split_pieces

THREADS = [1, 2, 3, 5]


def rand(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << 15), 1 << 15, shape, generator=g, dtype=torch.int16).view(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def blocks_case() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Destination and source blocks of every kind a mover issues, plus odd ones."""
    src_a = rand(7, 3000)  # contiguous, rows below the grain, odd row count
    src_b = rand(61, 96, 1, 72, seed=1)[:, 5:90].transpose(0, 1)  # strided, transposed
    src_c = rand(70001, seed=2)  # one 1-D block far above the grain
    src_d = rand(3, 40000, 3, seed=3, dtype=torch.float16)  # rows above the grain, odd bytes
    src_e = rand(5, 3, seed=4)  # tiny
    srcs = [src_a, src_b, src_c, src_d, src_e]
    dsts = [
        torch.zeros_like(s) if s.is_contiguous() else torch.zeros(s.shape, dtype=s.dtype)
        for s in srcs
    ]
    return dsts, srcs


def test_pieces_cover_every_byte_below_the_grain() -> None:
    dsts, srcs = blocks_case()
    pd, ps = split_pieces(dsts, srcs)
    assert len(pd) > len(dsts)
    assert all(p.numel() < GRAIN for p in pd)
    assert sum(p.numel() * p.element_size() for p in pd) == sum(
        d.numel() * d.element_size() for d in dsts
    )
    for d, s in zip(pd, ps, strict=True):
        assert d.shape == s.shape and d.dtype == s.dtype


@pytest.mark.parametrize("threads", THREADS)
def test_copy_pieces_bit_exact(threads: int) -> None:
    dsts, srcs = blocks_case()
    copy_pieces(dsts, srcs, threads)
    for d, s in zip(dsts, srcs, strict=True):
        assert torch.equal(bits(d), bits(s))


@pytest.mark.parametrize("threads", [-1, 0, *THREADS])
def test_copy_blocks_every_thread_setting_bit_exact(threads: int) -> None:
    dsts, srcs = blocks_case()
    copy_blocks(dsts, srcs, threads=threads)
    for d, s in zip(dsts, srcs, strict=True):
        assert torch.equal(bits(d), bits(s))


def test_a_casting_pair_is_copied_whole() -> None:
    d, s = torch.zeros(40000, dtype=torch.float32), rand(40000)
    pd, _ = split_pieces([d], [s])
    assert len(pd) == 1
    copy_blocks([d], [s], threads=2)
    assert torch.equal(bits(d), bits(s.float()))


@pytest.mark.parametrize("threads", [0, *THREADS])
def test_gather_pieces_bit_exact_with_and_without_buffer(threads: int) -> None:
    src = [rand(500, 1, 576, seed=i).view(torch.int64) for i in range(3)]
    g = torch.Generator().manual_seed(7)
    s_idx = torch.randint(0, 500, (700,), generator=g)  # sources repeat: that is allowed
    d_idx = torch.randperm(900, generator=g)[:700]  # destinations distinct
    want = [torch.zeros(900, 1, 144, dtype=torch.int64) for _ in src]
    for w, s in zip(want, src, strict=True):
        w.index_copy_(0, d_idx, s.index_select(0, s_idx))
    for out in (None, torch.empty(700, 1, 144, dtype=torch.int64)):
        got = [torch.zeros(900, 1, 144, dtype=torch.int64) for _ in src]
        gather_pieces(got, src, d_idx, s_idx, threads, out)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert index_chunk(144) * 144 < GRAIN and index_chunk(10**6) == 1


@pytest.mark.parametrize("threads", [-1, 1, 2])
def test_gather_rows_threads_fp8_bit_exact(threads: int) -> None:
    src = [
        rand(600, 1, 1024, seed=i).view(torch.uint8)[..., :1024].view(torch.float8_e4m3fn)
        for i in range(2)
    ]
    s_idx, d_idx = torch.arange(599, -1, -1), torch.randperm(600)
    dst = [torch.zeros(600, 1, 1024, dtype=torch.float8_e4m3fn) for _ in src]
    gather_rows(dst, src, d_idx, s_idx, threads=threads)
    for d, s in zip(dst, src, strict=True):
        want = torch.zeros(600, 1, 1024, dtype=torch.uint8)
        want.index_copy_(0, d_idx, s.view(torch.uint8).index_select(0, s_idx))
        assert torch.equal(d.view(torch.uint8), want)


@pytest.mark.parametrize("threads", [-1, 1, 2, 4])
def test_copy_runs_overlapping_source_runs(threads: int) -> None:
    """Source runs that overlap each other, copied into distinct destination runs."""
    src = rand(4, 4096, 1, 40)
    dst = torch.zeros(4, 9000, 1, 40, dtype=torch.bfloat16)
    runs = [(0, 0, 3000), (1000, 3100, 3000), (2999, 6200, 1097), (5, 8000, 1)]
    pairs = [(RunSide(src[i]), RunSide(dst[i])) for i in range(4)]
    copy_runs(runs, pairs, into_first=False, batched=False, threads=threads)
    want = torch.zeros_like(dst)
    for a, b, n in runs:
        want[:, b : b + n] = src[:, a : a + n]
    assert torch.equal(bits(dst), bits(want))


@pytest.mark.parametrize("threads", [-1, 1, 2, 3])
def test_memmove_blocks_threads_bit_exact(threads: int) -> None:
    src = rand(3 << 20, dtype=torch.int16)  # 6 MiB: above AUTO_MIN_BYTES
    dst = torch.zeros_like(src)
    step, size = 8192, 6000
    offs = list(range(0, src.numel() * 2 - size, step))[::-1]
    memmove_blocks(
        [dst.data_ptr() + o for o in offs], [src.data_ptr() + o for o in offs], [size] * len(offs),
        threads=threads,
    )  # fmt: skip
    want = torch.zeros_like(src).view(torch.uint8)
    for o in offs:
        want[o : o + size] = src.view(torch.uint8)[o : o + size]
    assert torch.equal(dst.view(torch.uint8), want)


def test_split_parts() -> None:
    assert split_parts(0, 3) == []
    assert split_parts(5, 1) == [(0, 5)]
    assert split_parts(2, 5) == [(0, 1), (1, 2)]
    assert split_parts(7, 3) == [(0, 2), (2, 4), (4, 7)]


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize("threads", [1, 2])
def test_pools_move_bit_exact_with_pinned_threads(layout: str, threads: int) -> None:
    """Every mover path, forced, with pinned copy threads: a round trip returns every byte."""
    for tune in (
        CopyTuning(copy_threads=threads, by_address_min_block_bytes=0),  # by address
        CopyTuning(
            copy_threads=threads, by_address_min_block_bytes=NEVER, gather_below_run_bytes=NEVER
        ),
        CopyTuning(
            copy_threads=threads, by_address_min_block_bytes=NEVER, gather_below_run_bytes=0
        ),
        CopyTuning(copy_threads=threads, stacked_min_run_bytes=0),  # all-layer strided
    ):
        backend = sgl_core.TorchBackend(tuning=tune)
        kw = dict(
            size=1024,
            page_size=16,
            dtype=torch.bfloat16,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            layer_num=3,
        )
        dev, back = backend.create_device_pool(**kw), backend.create_device_pool(**kw)  # type: ignore[arg-type]
        fill_device_random(dev, 3)
        host = backend.create_host_pool(dev, layout=layout)
        h_idx = page_indices([9, 0, 3, 4, 5, 60, 61, 2] * 1, 16)
        d_idx = page_indices([1, 2, 3, 40, 41, 42, 7, 8], 16)
        host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
        for layer in range(3):
            host.load_to_device_per_layer(back, h_idx, d_idx, layer, "direct")
            assert torch.equal(device_rows(back, layer, d_idx), device_rows(dev, layer, d_idx))


def test_copy_tuning_refuses_a_negative_thread_count() -> None:
    with pytest.raises(ValueError, match="copy_threads"):
        CopyTuning(copy_threads=-2)
    assert CopyTuning().copy_threads == -1  # AUTO: measured


def test_shutdown_stops_the_copy_threads_and_a_new_pool_starts() -> None:
    dsts, srcs = blocks_case()
    copy_pieces(dsts, srcs, 2)
    pool = _copy._executor
    assert pool is not None
    shutdown_copy_threads()
    assert getattr(_copy, "_executor") is None  # noqa: B009 (read again: mypy narrowed it)
    assert pool._shutdown
    dsts, srcs = blocks_case()
    copy_pieces(dsts, srcs, 2)
    again = getattr(_copy, "_executor")  # noqa: B009
    assert again is not None and again is not pool
    assert all(torch.equal(bits(d), bits(s)) for d, s in zip(dsts, srcs, strict=True))


def _child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    # ATen's own OpenMP team is not fork-safe once the parent has used it (a
    # libgomp limit, not ours: the whole suite runs before this test): the child's
    # checks (torch.equal, the inputs) stay on one ATen thread, and what is
    # tested is that our copy threads start anew in the child.
    torch.set_num_threads(1)
    dsts, srcs = blocks_case()
    copy_pieces(dsts, srcs, 3)
    queue.put(all(torch.equal(bits(d), bits(s)) for d, s in zip(dsts, srcs, strict=True)))


def forked_result(child_fn: Callable[[Any], None]) -> object:
    """What ``child_fn(queue)`` puts in the queue, run in a forked child that must end
    within a minute with exit status 0 (a child stuck on the parent's threads fails)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=child_fn, args=(queue,))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, "the child hung on the parent's threads"
    assert child.exitcode == 0
    return queue.get(timeout=5)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_copies_with_threads_of_its_own() -> None:
    dsts, srcs = blocks_case()
    copy_pieces(dsts, srcs, 3)  # the parent's pool exists and has threads
    assert _copy._executor is not None
    assert forked_result(_child) is True


@pytest.mark.parametrize(
    ("shape", "sizes"),
    [
        ((70001,), [GRAIN - 1, GRAIN - 1, 70001 - 2 * (GRAIN - 1)]),  # 1-D: widest pieces
        ((1, 40000), [GRAIN - 1, 40000 - (GRAIN - 1)]),  # a leading 1 is looked through
        ((1, 1, 40000), [GRAIN - 1, 40000 - (GRAIN - 1)]),
        ((5, 12000), [24000, 24000, 12000]),  # two rows per piece
        ((2, GRAIN), [GRAIN - 1, 1, GRAIN - 1, 1]),  # a row of exactly the grain is cut
        ((GRAIN,), [GRAIN - 1, 1]),  # exactly the grain elements: not one piece
        ((3, 100), [300]),  # below the grain: whole
    ],
)
def test_pieces_are_the_widest_below_the_grain(shape: tuple[int, ...], sizes: list[int]) -> None:
    """Each piece stays below ATen's grain (no OpenMP team) and is as wide as that allows."""
    src = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int64).reshape(shape)
    pd, ps = split_pieces([torch.zeros_like(src)], [src])
    assert [p.numel() for p in pd] == sizes
    assert [p.numel() for p in ps] == sizes
    flat = torch.cat([p.reshape(-1) for p in ps])
    assert torch.equal(flat, src.reshape(-1))  # in order, every element once
    dst = torch.zeros_like(src)
    copy_pieces([dst], [src], 1)
    assert torch.equal(dst, src)


def test_auto_copies_unregistered_is_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kit calls the measured copies through their registration, never silently
    without them (sgl_core registers them on import)."""
    from sgl_core.transfer.copy import _copy
    from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES

    monkeypatch.setattr(_copy, "_auto", {})
    big = torch.zeros(AUTO_MIN_BYTES, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="_auto_copy not imported"):
        _copy.copy_blocks([big.clone()], [big], threads=AUTO)
    with pytest.raises(RuntimeError, match="_auto_copy not imported"):
        _copy.memmove_blocks(
            [big.data_ptr(), big.data_ptr()],
            [big.data_ptr()] * 2,
            [AUTO_MIN_BYTES] * 2,
            threads=AUTO,
        )


def test_small_auto_copies_take_one_thread_without_measuring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``AUTO_MIN_BYTES``, or one block to move by address, ``AUTO`` is 1 at once."""
    from sgl_core.transfer.copy import _copy
    from sgl_core.transfer.copy._tuning import AUTO, AUTO_MIN_BYTES

    monkeypatch.setattr(_copy, "_auto", {})  # reaching the measured copies would raise
    src = torch.randint(0, 255, (2 * AUTO_MIN_BYTES,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    half = AUTO_MIN_BYTES // 2 - 1
    _copy.copy_blocks(
        [dst[:half], dst[half : 2 * half]], [src[:half], src[half : 2 * half]], threads=AUTO
    )
    assert torch.equal(dst[: 2 * half], src[: 2 * half])
    dst.zero_()
    ptrs = [dst.data_ptr(), dst.data_ptr() + half], [src.data_ptr(), src.data_ptr() + half]
    _copy.memmove_blocks(*ptrs, [half, half], threads=AUTO)  # two blocks, under the minimum
    assert torch.equal(dst[: 2 * half], src[: 2 * half])
    dst.zero_()
    _copy.memmove_blocks([dst.data_ptr()], [src.data_ptr()], [2 * AUTO_MIN_BYTES], threads=AUTO)
    assert torch.equal(dst, src)  # one block, however big
