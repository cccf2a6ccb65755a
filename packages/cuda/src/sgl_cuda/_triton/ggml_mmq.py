"""Expert-grouped (MMQ-style) GGML MoE kernel: ``ggml_moe_a8`` for batches.

The (token, expert) pairs arrive sorted by expert and padded to ``BLOCK_M``
per expert (see :mod:`sgl_cuda.quantization._align`): ``sorted_ids`` holds
pair indices (``num_pairs`` marks padding), ``expert_ids[b]`` the expert of
sorted block ``b``. One program computes a ``BLOCK_M`` (pairs) x ``BLOCK_N``
(output rows) tile, so each quantized weight block is decoded once per tile
instead of once per pair as in ``_moe_a8_vec_kernel``.

Numerics equal the vec kernel's: weights are decoded to their signed quant
ints with the same ``_decode_q``/``_group_scale_min`` helpers, dotted in int32
with the Q8_1 activation ints per 32-wide Q8_1 block (``tl.dot`` on int8, K=32),
then scaled: ``acc += d_a * scale * isum + s_a * min`` with Q8_1's
``s_a = d_a * sum(q_a)`` computed once with the activations. Types whose
scale group is 16 wide (Q2_K, Q3_K, Q6_K) do two K=32 dots per Q8_1 block,
each with the other half of the activations zeroed, because an int8
``tl.dot`` needs K >= 32 on the tensor cores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_cuda._triton.ggml import _decode_q, _group_scale_min, _interpreting

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps). BLOCK_M is also the alignment block
# the caller pads each expert's pairs to. tl.dot needs M, N >= 16 on a GPU.
# The defaults are the fewest sm_90 instructions per decoded weight among the
# tiles compiled without spills (ptxas); Q4_K gains from 64-wide K steps (its
# nibble half is then known at compile time). A GPU sweep
# (benchmarks/gpu_ggml_moe.py) decides between them and the others.
GPU_TILE_DEFAULT = (16, 128, 32, 4)
GPU_TILES = {12: (16, 128, 64, 4)}  # GGML type id 12 = Q4_K
_INTERP_TILE = (16, 128, 32, 1)


def default_tile(quant_type: int) -> tuple[int, int, int, int]:
    """The ``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)`` a launch uses unless told."""
    if _interpreting():
        return _INTERP_TILE
    return GPU_TILES.get(quant_type, GPU_TILE_DEFAULT)


@triton.jit
def _has_min(QTYPE: tl.constexpr):
    # Q4_1, Q5_1, Q2_K, Q4_K, Q5_K: weights are scale * q + min
    return QTYPE == 3 or QTYPE == 7 or QTYPE == 10 or QTYPE == 12 or QTYPE == 13  # noqa: PLR1714


@triton.jit
def _scaled_group_dot(acc, qa, qw, da, sa, pg, i, gmask, G: tl.constexpr, QTYPE: tl.constexpr):
    """``acc += d_a * (scale * (q_a . q_w) + min * sum(q_a))`` for one Q8_1 block.

    ``qa (BM, 32)`` int8, ``qw (32, BN)`` int8, ``da (BM,)``; ``pg (BN,)`` the
    weight-block pointers and ``i (BN,)`` the index of the block's first weight.
    Written as ``(d_a * scale) * isum [+ (d_a * sum(q_a)) * min]`` so each
    accumulator element costs one multiply and one or two FMAs.
    """
    if G == 32:
        isum = tl.dot(qa, qw, out_dtype=tl.int32).to(tl.float32)
        scale, mn = _group_scale_min(pg, i, gmask, QTYPE)
        acc += (da[:, None] * scale[None, :]) * isum
        if _has_min(QTYPE):
            # sa = d_a * sum(q_a), precomputed with the activations (Q8_1's s):
            # no cross-lane reduction here
            acc += sa[:, None] * mn[None, :]
    else:  # G == 16: two scale groups per Q8_1 block
        lo = (tl.arange(0, 32) < 16)[None, :]
        qa_lo = tl.where(lo, qa, tl.zeros_like(qa))
        qa_hi = tl.where(lo, tl.zeros_like(qa), qa)
        s_lo, m_lo = _group_scale_min(pg, i, gmask, QTYPE)
        s_hi, m_hi = _group_scale_min(pg, i + 16, gmask, QTYPE)
        i_lo = tl.dot(qa_lo, qw, out_dtype=tl.int32).to(tl.float32)
        i_hi = tl.dot(qa_hi, qw, out_dtype=tl.int32).to(tl.float32)
        acc += (da[:, None] * s_lo[None, :]) * i_lo
        acc += (da[:, None] * s_hi[None, :]) * i_hi
        if _has_min(QTYPE):
            a_lo = tl.sum(qa_lo.to(tl.int32), axis=1).to(tl.float32)
            a_hi = tl.sum(qa_hi.to(tl.int32), axis=1).to(tl.float32)
            acc += (da * a_lo)[:, None] * m_lo[None, :]
            acc += (da * a_hi)[:, None] * m_hi[None, :]
    return acc


@triton.jit
def _moe_a8_mmq_kernel(
    xq_ptr,
    xd_ptr,
    xs_ptr,
    w_ptr,
    sorted_ptr,
    expert_ids_ptr,
    npad_ptr,
    out_ptr,
    K,
    N,
    num_pairs,
    top_k,
    stride_xq,
    stride_xd,
    stride_we,
    stride_wn,
    stride_out,
    QTYPE: tl.constexpr,
    QK: tl.constexpr,
    BB: tl.constexpr,
    G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(npad_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + offs_m)
    m_mask = pair < num_pairs
    tok = (pair // top_k).to(tl.int64)
    xq_rows = xq_ptr + tok * stride_xq  # (BM,)
    xd_rows = xd_ptr + tok * stride_xd
    xs_rows = xs_ptr + tok * stride_xd  # same layout as xd

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    row_base = w_ptr + expert * stride_we + offs_n.to(tl.int64) * stride_wn  # (BN,)
    lane = tl.arange(0, 32)
    zero_n = tl.zeros((BLOCK_N,), dtype=tl.int32)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        for s in tl.static_range(BLOCK_K // 32):
            kb = k0 + s * 32  # first weight of this Q8_1 block
            # K is a multiple of 32: a Q8_1 block is either whole or past the end
            a_ok = m_mask & (kb < K)
            w_ok = n_mask & (kb < K)
            qa = tl.load(xq_rows[:, None] + (kb + lane)[None, :], mask=a_ok[:, None], other=0)
            da = tl.load(xd_rows + kb // 32, mask=a_ok, other=0.0)
            if _has_min(QTYPE) and G == 32:
                sa = tl.load(xs_rows + kb // 32, mask=a_ok, other=0.0)
            else:
                sa = da
            # one Q8_1 block never straddles a weight block (QK is 32 or 256):
            # the block pointer is per row, the in-block index per lane
            pg = row_base + (kb // QK) * BB  # (BN,)
            # 32 consecutive in-block indices from a multiple of 32: lets the
            # compiler see the 32 contiguous bytes and vectorize their loads
            i = tl.multiple_of(kb % QK, 32) + lane  # (32,)
            if QTYPE == 12 and BLOCK_K % 64 == 0 and BLOCK_K <= QK:
                # Q4_K with 64-aligned steps inside one block: the nibble half is
                # s % 2, a constant (same bytes and nibbles as _decode_q, without the
                # variable shift); a step wider than a block takes _decode_q below
                pair64 = tl.multiple_of(k0 % QK, 64) // 64 + s // 2  # 64-weight pair in block
                raw = tl.load(
                    pg[None, :] + 16 + pair64 * 32 + lane[:, None],
                    mask=w_ok[None, :],
                    other=0,
                )
                if s % 2 == 0:
                    qw = (raw & 15).to(tl.int8, bitcast=True)
                else:
                    qw = (raw >> 4).to(tl.int8, bitcast=True)
            else:
                qw = _decode_q(pg[None, :], i[:, None], w_ok[None, :], QTYPE).to(tl.int8)
            acc = _scaled_group_dot(
                acc,
                qa,
                qw,
                da,
                sa,
                pg,
                zero_n + kb % QK,
                w_ok,
                G,
                QTYPE,
            )

    out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * stride_out + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def moe_a8_mmq(
    xq: torch.Tensor,
    xd: torch.Tensor,
    xs: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_post_padded: torch.Tensor,
    out: torch.Tensor,
    *,
    top_k: int,
    quant_type: int,
    block_size: int,
    block_bytes: int,
    group_size: int,
    tile: tuple[int, int, int, int],
) -> None:
    """Launch the grouped kernel: ``out[p] = dequant(w[e(p)]) @ dequant_q8_1(x[p // top_k])``.

    ``xq, xd, xs`` are ``quantize_q8_1_with_sums(x)`` (``xs`` laid out as ``xd``).

    ``sorted_ids``/``expert_ids``/``num_post_padded`` come from aligning the
    pairs with ``BLOCK_M = tile[0]``; one program per (sorted block, ``BLOCK_N``
    output rows). Blocks past ``num_post_padded`` exit at once.
    """
    pairs, n = out.shape
    k = xq.shape[1]
    if pairs == 0 or n == 0:
        return
    if k == 0:
        out.zero_()
        return
    block_m, block_n, block_k, num_warps = tile
    grid = (expert_ids.numel(), triton.cdiv(n, block_n))
    extra = {} if _interpreting() else {"num_warps": num_warps}
    _moe_a8_mmq_kernel[grid](
        xq,
        xd,
        xs,
        w,
        sorted_ids,
        expert_ids,
        num_post_padded,
        out,
        k,
        n,
        pairs,
        top_k,
        xq.stride(0),
        xd.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        QTYPE=quant_type,
        QK=block_size,
        BB=block_bytes,
        G=group_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        **extra,
    )
