"""CPU copies with ``copy_threads = AUTO``: the thread count chosen by measurement
(candidates and samples: docs/design.md, "Copy threads, calibrated").

The sample copies blocks of the call before the call itself, so the blocks must not
overlap their own sources (true of every mover: the device pool and the host pool are
separate buffers).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence

import torch

from sgl_core.transfer.copy import _busy, _copy
from sgl_core.transfer.copy._calibrate import default_calibrator
from sgl_core.transfer.copy._copy import copy_blocks, memmove_blocks
from sgl_core.transfer.copy._pieces import index_chunk
from sgl_core.transfer.copy._stream_gather import GatherStreams, gather_streams
from sgl_core.transfer.copy._tuning import AUTO_MIN_BYTES
from sgl_core.transfer.copy._turns import offered_turn, timed_turn

__all__ = [
    "AUTO_MIN_BYTES",
    "SAMPLE_BYTES",
    "auto_copy_blocks",
    "auto_gather",
    "auto_memmove",
    "gather_pieces",
    "thread_candidates",
    "thread_ranks",
]

SAMPLE_BYTES = 1 << 20
SEGMENTS = 8  # disjoint sample segments, so no candidate is timed on cache-hot data


def thread_candidates(*, with_aten: bool = True) -> list[int]:
    """Thread counts to measure, in preference order: 1, our threads, then ATen's."""
    many = _copy._workers + 1
    return [1, *([many] if many > 1 else []), *([0] if with_aten else [])]


def thread_ranks(names: Iterable[str]) -> dict[str, int]:
    """Each candidate's rank for the calibrator's margin (``Calibrator.choose``): its
    thread count (``1`` and ``stream1`` one, ``n`` and ``stream<n>`` n), ATen's team
    ``0`` after all of them. More threads are the risk under load (a busy core delays
    them; a team's waits for every core), so only they must be clearly faster; the
    streaming copy and memmove (or torch) on as many threads compete on speed alone."""
    threads = {name: int(name.removeprefix("stream")) for name in names}
    team = max(threads.values(), default=0) + 1
    return {name: t or team for name, t in threads.items()}


def _bucket(nbytes: int) -> str:
    size = 1 << max(nbytes, 1).bit_length() - 1
    return f"{size >> 10}KiB" if size >= 1024 else f"{size}B"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _run(
    key: str,
    total: int,
    sample: Callable[[], tuple[Sequence[int], Callable[[int, int, int], None]]],
    full: Callable[[int], None],
    with_aten: bool = True,
    streams: GatherStreams | None = None,
) -> None:
    """Resolve ``key`` (measuring on ``sample()`` if needed), run ``full``, report its speed.

    ``sample()`` (built only when measuring) returns ``(sizes, run)``: the
    bytes of each item of the call's first items, and ``run(threads, a, b)``,
    which copies items ``[a, b)``. Successive timed runs take successive
    disjoint segments (``_spans``), so a candidate is not timed on data the
    previous one left in cache. ``streams``: the same copy as the streaming copy,
    offered as ``stream<n>`` after the thread counts. A choice of ATen's team
    (``0``) runs only while the machine has a free core for each of its threads
    (``_busy.team_fits``).
    """
    names = [str(t) for t in thread_candidates(with_aten=with_aten)]
    if streams is not None:
        names += [f"stream{t}" for t in thread_candidates(with_aten=False)]

    def execute(name: str) -> None:
        if name.startswith("stream") and streams is not None:
            streams[1](int(name.removeprefix("stream")))
        else:
            full(int(name))

    cal = default_calibrator()
    chosen = cal.current(key)
    if chosen not in names:  # unknown, stale, or a candidate this call does not offer
        sizes, run = sample()
        spans = _spans(sizes)
        turn = itertools.count()

        def candidate(name: str) -> None:
            a, b = spans[next(turn) % len(spans)]
            if name.startswith("stream") and streams is not None:
                streams[0](int(name.removeprefix("stream")), a, b)
            else:
                run(int(name), a, b)

        cands = {name: functools.partial(candidate, name) for name in names}
        nbytes = sum(sizes[spans[0][0] : spans[-1][1]]) // len(spans)
        chosen = cal.choose(key, cands, nbytes, ranks=thread_ranks(names), confirm=True)
    given = offered_turn(cal, key, names)  # a close sample is confirmed on real calls
    ran = given or chosen
    if ran == "0" and not _busy.team_fits():
        # ATen's team would wait for a busy core: the candidate the same measurement ranks
        # first without it, this call only (its time is not the choice's: not observed);
        # a trial's turn of the team is withdrawn
        if given is not None:
            cal.withdraw(key, "0")
        execute(cal.skip(key, "0", among=names, ranks=thread_ranks(names)))
        return
    timed_turn(cal, key, total, ran, functools.partial(execute, ran))


def _spans(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Up to ``SEGMENTS`` disjoint runs of consecutive items, each about ``SAMPLE_BYTES``."""
    spans: list[tuple[int, int]] = []
    start, got = 0, 0
    for i, n in enumerate(sizes):
        got += n
        if got >= SAMPLE_BYTES:
            spans.append((start, i + 1))
            start, got = i + 1, 0
            if len(spans) == SEGMENTS:
                break
    return spans or [(0, len(sizes))]


def auto_copy_blocks(dst_list: list[torch.Tensor], src_list: list[torch.Tensor]) -> None:
    """``copy_blocks`` between CPU buffers with a measured thread count."""
    total = sum(_nbytes(t) for t in dst_list)
    strided = not (dst_list[0].is_contiguous() and src_list[0].is_contiguous())
    kind = "strided" if strided else "contiguous"
    key = f"copy cpu->cpu {_bucket(total // len(dst_list))} {kind}"

    def sample() -> tuple[list[int], Callable[[int, int, int], None]]:
        # The call's first blocks, big ones cut along dim 0 to about ``SAMPLE_BYTES``.
        ud: list[torch.Tensor] = []
        us: list[torch.Tensor] = []
        got = 0
        for d, s in zip(dst_list, src_list, strict=True):
            size = _nbytes(d)
            if size > 2 * SAMPLE_BYTES and d.dim() and d.shape[0] > 1:
                rows = max(1, d.shape[0] * SAMPLE_BYTES // size)
                ud.extend(torch.split(d, rows))
                us.extend(torch.split(s, rows))
            else:
                ud.append(d)
                us.append(s)
            got += size
            if got >= SEGMENTS * SAMPLE_BYTES:
                break

        def run(threads: int, a: int, b: int) -> None:
            copy_blocks(ud[a:b], us[a:b], threads=threads)

        return [_nbytes(t) for t in ud], run

    _run(key, total, sample, lambda t: copy_blocks(dst_list, src_list, threads=t))


def auto_memmove(dst: Sequence[int], src: Sequence[int], sizes: Sequence[int]) -> None:
    """``memmove_blocks`` with a measured thread count (memmove itself never starts a team)."""
    total = sum(sizes)  # at least AUTO_MIN_BYTES in two blocks or more (memmove_blocks)
    key = f"memmove cpu->cpu {_bucket(total // len(sizes))}"

    def run(threads: int, a: int, b: int) -> None:
        memmove_blocks(dst[a:b], src[a:b], sizes[a:b], threads=threads)

    _run(
        key,
        total,
        lambda: (sizes, run),
        lambda t: memmove_blocks(dst, src, sizes, threads=t),
        False,
    )


def gather_pieces(
    dst: Sequence[torch.Tensor],
    src: Sequence[torch.Tensor],
    d_idx: torch.Tensor,
    s_idx: torch.Tensor,
    threads: int,
    out: torch.Tensor | None = None,
) -> None:
    """``dst[i][d_idx] = src[i][s_idx]`` along dim 0 in chunks below ATen's grain, threaded.

    Each chunk is one ``index_select`` into a buffer and one ``index_copy_``;
    destination indices are distinct (validated), so chunks on different
    threads never write the same row. ``out`` is the caller's reused staging
    buffer, else each thread allocates one chunk. ``threads`` 0 is one thread
    too (this function never hands a chunk to ATen's team).
    """
    count = d_idx.numel()
    if not dst or count == 0:
        return
    step = index_chunk(src[0][0].numel() if src[0].dim() > 1 else 1)
    work = [(i, a, min(a + step, count)) for i in range(len(dst)) for a in range(0, count, step)]
    # ``out``'s rows [a, b) serve chunk [a, b) of every pair: shared only on one thread
    # or with one pair (two threads must never fill the same rows)
    fits = out is not None and out.shape[0] >= count and out.is_contiguous()
    fits = fits and (threads <= 1 or len(dst) == 1)

    def chunk_buffer(s: torch.Tensor, held: torch.Tensor | None) -> torch.Tensor:
        if fits and out is not None and out.dtype == s.dtype and out.shape[1:] == s.shape[1:]:
            return out
        if held is not None and held.dtype == s.dtype and held.shape[1:] == s.shape[1:]:
            return held
        return torch.empty((min(step, count), *s.shape[1:]), dtype=s.dtype)

    def part(lo: int, hi: int) -> None:
        held: torch.Tensor | None = None
        for i, a, b in work[lo:hi]:
            held = chunk_buffer(src[i], held)
            at = a if held is out else 0
            rows = torch.index_select(src[i], 0, s_idx[a:b], out=held[at : at + b - a])
            dst[i].index_copy_(0, d_idx[a:b], rows)

    _copy._spread(max(threads, 1), len(work), part)


def auto_gather(
    dst: Sequence[torch.Tensor],
    src: Sequence[torch.Tensor],
    d_idx: torch.Tensor,
    s_idx: torch.Tensor,
    whole: Callable[[], None],
) -> None:
    """A CPU gather/scatter along dim 0 with a measured count: ``whole()`` (0), pieces, or
    the streaming copy (``gather_streams``, where it may copy these rows)."""
    row = _nbytes(src[0][0])
    total = sum(_nbytes(s[0]) for s in src) * d_idx.numel()

    def run(threads: int, a: int, b: int) -> None:
        di, si = d_idx[a:b], s_idx[a:b]
        if threads == 0:
            dst[0].index_copy_(0, di, src[0].index_select(0, si))
        else:
            gather_pieces(dst[:1], src[:1], di, si, threads)

    def sample() -> tuple[list[int], Callable[[int, int, int], None]]:
        per = max(1, SAMPLE_BYTES // max(row, 1))
        return [row] * min(d_idx.numel(), SEGMENTS * per), run

    def full(t: int) -> None:
        if t == 0:
            whole()
        else:
            gather_pieces(dst, src, d_idx, s_idx, t)

    key = f"gather cpu->cpu {_bucket(row)} rows"
    _run(key, total, sample, full, streams=gather_streams(dst, src, d_idx, s_idx))


_copy.register_auto_copies(auto_copy_blocks, auto_memmove)
