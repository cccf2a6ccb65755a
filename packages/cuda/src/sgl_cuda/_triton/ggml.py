"""Triton kernels of the GGML (GGUF) MoE method: Q8_1 activation quantization,
the blocked ``ggml_moe_a8_vec`` dot-product kernel and the expert-grouped
(MMQ-style) ``ggml_moe_a8`` kernel for batches.

Validation lives in :mod:`sgl_cuda.quantization._ops`; the launchers here
assume well-formed, validated arguments.

Block layouts (byte offsets inside one block, ``i`` the weight's index in the
block, little-endian f16 scales) follow ggml's ``block_q*`` structs:

* Q4_0 (32 w, 18 B): d@0, nibbles@2: ``qs[i%16] >> 4*(i//16)``, w = d*(q-8)
* Q4_1 (32 w, 20 B): d@0, m@2, nibbles@4, w = d*q + m
* Q5_0 (32 w, 22 B): d@0, qh u32@2 (bit i), nibbles@6, w = d*(q-16)
* Q5_1 (32 w, 24 B): d@0, m@2, qh@4, nibbles@8, w = d*q + m
* Q8_0 (32 w, 34 B): d@0, int8@2, w = d*q
* Q2_K (256 w, 84 B): scales[16]@0 (lo nibble scale, hi nibble min, per 16 w),
  2-bit qs@16, d@80, dmin@82
* Q3_K (256 w, 110 B): hmask@0, 2-bit qs@32, 6-bit signed scales@96 (12 B), d@108
* Q4_K (256 w, 144 B): d@0, dmin@2, 6-bit scales/mins@4 (12 B, per 32 w), nibbles@16
* Q5_K (256 w, 176 B): as Q4_K plus qh@16, nibbles@48
* Q6_K (256 w, 210 B): low nibbles@0, 2-bit highs@128, int8 scales@192 (per 16 w), d@208
* IQ4_NL (32 w, 18 B): d@0, nibbles@2 as Q4_0, w = d * KVALUES[q] (a fixed
  16-entry non-linear int8 table)
* IQ4_XS (256 w, 136 B): d@0, scales_h u16@2 (2 bits per 32 w), scales_l@4
  (4 bits per 32 w), nibbles@8 (16 B per 32 w, as Q4_0), w = d*(ls-32)*KVALUES[q]
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Tile sizes. The interpreter runs a program's tile ops as numpy calls, so it
# wants few, large programs; a GPU wants tiles that stay in registers.
# ``(BLOCK_N, num_warps)`` per quant type from benchmarks/ggml_tune.py on an
# H200 (BLOCK_K 256 won everywhere; 512 spills). Q4_K: 1.14x the default over
# gate_up/down at 1 and 32 tokens. Only Q4_K and Q8_0 were swept; Q8_0 kept
# the default.
_GPU_TILE_DEFAULT = (16, 4)
_GPU_TILES = {12: (8, 2)}  # GGML type id 12 = Q4_K
_INTERP_BLOCK_N = 128
_GPU_QBLOCK = 256
_INTERP_QBLOCK = 1024


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _u8(p, m):
    return tl.load(p, mask=m, other=0).to(tl.int32)


@triton.jit
def _i8(p, m):
    return tl.load(p, mask=m, other=0).to(tl.int8, bitcast=True).to(tl.int32)


@triton.jit
def _f16(p, m):
    """The f16 at byte pointer ``p`` as float32: one 2-byte load.

    Every f16 in these blocks sits at an even offset of an even-sized block,
    so it is 2-byte aligned when the weights start at an even address (the
    ops check that).
    """
    return tl.load(p.to(tl.pointer_type(tl.float16)), mask=m, other=0.0).to(tl.float32)


@triton.jit
def _iq4_value(nib):
    """IQ4 non-linear value of a 4-bit index: ``KVALUES[nib]``.

    The 16 int8 table entries are packed little-endian into four int32 words
    (no gather from a table pointer, so both kernels keep their signatures).
    """
    word = tl.where(
        nib < 8,
        tl.where(nib < 4, -1079142271, -152379953),  # -127 -104 -83 -65 | -49 -35 -22 -10
        tl.where(nib < 12, 639175937, 1901675829),  # 1 13 25 38 | 53 69 89 113
    )
    b = (word >> ((nib % 4) * 8)) & 255
    return b - ((b >> 7) << 8)


@triton.jit
def _decode_q(p, i, m, QTYPE: tl.constexpr):
    """Signed integer quant value of weight ``i`` of the block at ``p``."""
    if QTYPE == 2:  # Q4_0
        q = ((_u8(p + 2 + i % 16, m) >> ((i // 16) * 4)) & 15) - 8
    elif QTYPE == 3:  # Q4_1
        q = (_u8(p + 4 + i % 16, m) >> ((i // 16) * 4)) & 15
    elif QTYPE == 6:  # Q5_0
        lo = (_u8(p + 6 + i % 16, m) >> ((i // 16) * 4)) & 15
        hb = (_u8(p + 2 + i // 8, m) >> (i % 8)) & 1
        q = (lo | (hb << 4)) - 16
    elif QTYPE == 7:  # Q5_1
        lo = (_u8(p + 8 + i % 16, m) >> ((i // 16) * 4)) & 15
        hb = (_u8(p + 4 + i // 8, m) >> (i % 8)) & 1
        q = lo | (hb << 4)
    elif QTYPE == 8:  # Q8_0
        q = _i8(p + 2 + i, m)
    elif QTYPE == 10:  # Q2_K
        q = (_u8(p + 16 + (i // 128) * 32 + i % 32, m) >> (((i % 128) // 32) * 2)) & 3
    elif QTYPE == 11:  # Q3_K: 2 low bits, minus 4 when the hmask bit is clear
        lo = (_u8(p + 32 + (i // 128) * 32 + i % 32, m) >> (((i % 128) // 32) * 2)) & 3
        hb = (_u8(p + i % 32, m) >> (i // 32)) & 1
        q = lo - 4 + 4 * hb
    elif QTYPE == 12:  # Q4_K
        q = (_u8(p + 16 + (i // 64) * 32 + i % 32, m) >> (((i // 32) % 2) * 4)) & 15
    elif QTYPE == 13:  # Q5_K
        lo = (_u8(p + 48 + (i // 64) * 32 + i % 32, m) >> (((i // 32) % 2) * 4)) & 15
        hb = (_u8(p + 16 + i % 32, m) >> (i // 32)) & 1
        q = lo | (hb << 4)
    elif QTYPE == 20:  # IQ4_NL
        q = _iq4_value((_u8(p + 2 + i % 16, m) >> ((i // 16) * 4)) & 15)
    elif QTYPE == 23:  # IQ4_XS
        q = _iq4_value((_u8(p + 8 + (i // 32) * 16 + i % 16, m) >> (((i % 32) // 16) * 4)) & 15)
    else:  # Q6_K (14)
        lo = (_u8(p + (i // 128) * 64 + i % 64, m) >> (((i % 128) // 64) * 4)) & 15
        hi = (_u8(p + 128 + (i // 128) * 32 + i % 32, m) >> (((i % 128) // 32) * 2)) & 3
        q = (lo | (hi << 4)) - 32
    return q


@triton.jit
def _group_scale_min(p, i, m, QTYPE: tl.constexpr):
    """``(scale, min)`` of the group starting at weight ``i`` of the block at ``p``.

    A group's weights are ``scale * q + min``.
    """
    # `in` is not a Triton-compilable comparison, hence the chained ==
    if QTYPE == 2 or QTYPE == 6 or QTYPE == 8 or QTYPE == 20:  # noqa: PLR1714  (Q4_0, Q5_0, Q8_0, IQ4_NL)
        scale = _f16(p, m)
        mn = scale * 0.0
    elif QTYPE == 3 or QTYPE == 7:  # noqa: PLR1714  (Q4_1, Q5_1)
        scale = _f16(p, m)
        mn = _f16(p + 2, m)
    elif QTYPE == 10:  # Q2_K
        sc = _u8(p + i // 16, m)
        scale = _f16(p + 80, m) * (sc & 15).to(tl.float32)
        mn = -(_f16(p + 82, m) * (sc >> 4).to(tl.float32))
    elif QTYPE == 11:  # Q3_K
        j = i // 16
        lo = (_u8(p + 96 + j % 8, m) >> ((j // 8) * 4)) & 15
        hi = (_u8(p + 104 + j % 4, m) >> ((j // 4) * 2)) & 3
        scale = _f16(p + 108, m) * ((lo | (hi << 4)) - 32).to(tl.float32)
        mn = scale * 0.0
    elif QTYPE == 12 or QTYPE == 13:  # noqa: PLR1714  (Q4_K, Q5_K: 6-bit scales, mins)
        j = i // 32
        a = _u8(p + 4 + j, m)
        b = _u8(p + 8 + j, m)
        c = _u8(p + 4 + j % 4, m)
        sc = tl.where(j < 4, a & 63, (b & 15) | ((c >> 6) << 4))
        mv = tl.where(j < 4, b & 63, (b >> 4) | ((a >> 6) << 4))
        scale = _f16(p, m) * sc.to(tl.float32)
        mn = -(_f16(p + 2, m) * mv.to(tl.float32))
    elif QTYPE == 23:  # IQ4_XS: 6-bit scale per 32 w, low 4 bits @4, high 2 bits @2
        j = i // 32
        lo = (_u8(p + 4 + j // 2, m) >> ((j % 2) * 4)) & 15
        hi = (_u8(p + 2 + j // 4, m) >> ((j % 4) * 2)) & 3
        scale = _f16(p, m) * ((lo | (hi << 4)) - 32).to(tl.float32)
        mn = scale * 0.0
    else:  # Q6_K
        scale = _f16(p + 208, m) * _i8(p + 192 + i // 16, m).to(tl.float32)
        mn = scale * 0.0
    return scale, mn


@triton.jit
def _quantize_q8_1_kernel(
    x_ptr,
    q_ptr,
    d_ptr,
    s_ptr,
    K,
    stride_x,
    stride_q,
    stride_d,
    stride_s,
    BLOCK: tl.constexpr,
    WITH_S: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    kb = tl.program_id(1)
    offs = kb * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    xb = tl.reshape(x, (BLOCK // 32, 32))
    # IEEE-rounded divisions: a compiled ``/`` on float32 is approximate (1 ulp
    # off the reference's d and, at a rounding tie, one step off its q).
    amax = tl.max(tl.abs(xb), axis=1)
    d = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    v = tl.math.div_rn(xb, tl.broadcast_to(tl.where(d > 0.0, d, 1.0)[:, None], xb.shape))
    # roundf (half away from zero), computed exactly: floor(a) + floor(2 * frac(a))
    a = tl.abs(v)
    fl = tl.floor(a)
    r = tl.minimum(fl + tl.floor(2.0 * (a - fl)), 127.0)
    q = tl.where(v < 0.0, -r, r).to(tl.int8)
    tl.store(q_ptr + t * stride_q + offs, tl.reshape(q, (BLOCK,)), mask=mask)
    boffs = kb * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    tl.store(d_ptr + t * stride_d + boffs, d, mask=boffs < K // 32)
    if WITH_S:  # Q8_1's s = d * sum(q): what a weight block's min multiplies
        qsum = tl.sum(q.to(tl.int32), axis=1).to(tl.float32)
        tl.store(s_ptr + t * stride_s + boffs, d * qsum, mask=boffs < K // 32)


@triton.jit
def _moe_a8_vec_kernel(
    xq_ptr,
    xd_ptr,
    w_ptr,
    ids_ptr,
    out_ptr,
    K,
    N,
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
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    tok = (pair // top_k).to(tl.int64)
    expert = tl.load(ids_ptr + pair).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    row_base = w_ptr + expert * stride_we + offs_n.to(tl.int64) * stride_wn  # (BLOCK_N,)
    xq_row = xq_ptr + tok * stride_xq
    xd_row = xd_ptr + tok * stride_xd

    acc = tl.zeros((BLOCK_N, BLOCK_K // G), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # activations: BLOCK_K int8 values, one Q8_1 scale per 32
        kk = k0 + tl.arange(0, BLOCK_K)
        k_mask = kk < K
        qa = tl.load(xq_row + kk, mask=k_mask, other=0).to(tl.int32)
        kg = k0 + tl.arange(0, BLOCK_K // G) * G
        g_mask = kg < K
        da = tl.load(xd_row + kg // 32, mask=g_mask, other=0.0)
        asum = tl.sum(tl.reshape(qa, (BLOCK_K // G, G)), axis=1)

        # weights: decode the quant ints of a (BLOCK_N, BLOCK_K) tile straight from
        # the block bytes and reduce q_w * q_a per scale group in integers
        i = kk % QK
        p = row_base[:, None] + ((kk // QK) * BB)[None, :]
        q = _decode_q(p, i[None, :], n_mask[:, None] & k_mask[None, :], QTYPE)
        isum = tl.sum(tl.reshape(q * qa[None, :], (BLOCK_N, BLOCK_K // G, G)), axis=2)

        pg = row_base[:, None] + ((kg // QK) * BB)[None, :]
        scale, mn = _group_scale_min(
            pg, (kg % QK)[None, :], n_mask[:, None] & g_mask[None, :], QTYPE
        )
        acc += da[None, :] * (scale * isum.to(tl.float32) + mn * asum.to(tl.float32)[None, :])

    y = tl.sum(acc, axis=1)
    tl.store(
        out_ptr + pair.to(tl.int64) * stride_out + offs_n,
        y.to(out_ptr.dtype.element_ty),
        mask=n_mask,
    )


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def quantize_q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_1-quantize rows of ``x (tokens, K)`` (both > 0, ``K % 32 == 0``, unit last stride).

    Returns ``(q int8 (tokens, K), d float32 (tokens, K // 32))`` with
    ``d = amax / 127`` per block of 32 and ``q = roundf(x / d)``.
    """
    q, d, _ = _quantize(x, with_sums=False)
    return q, d


def quantize_q8_1_with_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_q8_1` plus ``s = d * sum(q)`` per block of 32 (float32)."""
    return _quantize(x, with_sums=True)


def _quantize(
    x: torch.Tensor, *, with_sums: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, k = x.shape
    q = torch.empty((tokens, k), dtype=torch.int8, device=x.device)
    d = torch.empty((tokens, k // 32), dtype=torch.float32, device=x.device)
    s = torch.empty_like(d) if with_sums else d
    cap = _INTERP_QBLOCK if _interpreting() else _GPU_QBLOCK
    block = max(32, min(cap, _next_pow2(k)))
    grid = (tokens, triton.cdiv(k, block))
    _quantize_q8_1_kernel[grid](
        x,
        q,
        d,
        s,
        k,
        x.stride(0),
        q.stride(0),
        d.stride(0),
        s.stride(0),
        BLOCK=block,
        WITH_S=with_sums,
    )
    return q, d, s


def moe_a8_vec(
    xq: torch.Tensor,
    xd: torch.Tensor,
    w: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor,
    *,
    top_k: int,
    quant_type: int,
    block_size: int,
    block_bytes: int,
    group_size: int,
    tile: tuple[int, int, int] | None = None,
) -> None:
    """Launch the blocked kernel: ``out[p] = dequant(w[ids[p]]) @ dequant_q8_1(x[p // top_k])``.

    One program per (token-expert pair, ``BLOCK_N`` output rows); it loops over
    K in ``BLOCK_K`` steps (a multiple of the block size). ``tile`` overrides
    ``(BLOCK_N, BLOCK_K, num_warps)`` (benchmarks/ggml_tune.py sweeps it).
    """
    pairs, n = out.shape  # pairs, n and K > 0: the ops return empty outputs and K = 0's zeros
    k = xq.shape[1]
    interpreting = _interpreting()
    tile_n, num_warps = _GPU_TILES.get(quant_type, _GPU_TILE_DEFAULT)
    block_n = min(_INTERP_BLOCK_N if interpreting else tile_n, _next_pow2(n))
    block_k = max(block_size, min(256, _next_pow2(k)))
    if tile is not None:
        block_n, block_k, num_warps = tile
    grid = (pairs, triton.cdiv(n, block_n))
    extra = {} if interpreting else {"num_warps": num_warps}
    _moe_a8_vec_kernel[grid](
        xq,
        xd,
        w,
        ids,
        out,
        k,
        n,
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
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        **extra,
    )


# ------------------------------------------------------- expert-grouped (MMQ)
# The (token, expert) pairs arrive sorted by expert and padded to ``BLOCK_M``
# per expert (sgl_cuda.quantization._align): ``sorted_ids`` holds pair indices
# (``num_pairs`` marks padding), ``expert_ids[b]`` the expert of sorted block
# ``b``. One program computes a ``BLOCK_M`` (pairs) x ``BLOCK_N`` (output rows)
# tile, so each weight block is decoded once per tile, not once per pair. The
# quant ints are dotted in int32 with the Q8_1 activation ints per 32-wide Q8_1
# block (``tl.dot`` on int8, K=32), then scaled: ``acc += d_a * scale * isum +
# s_a * min`` with Q8_1's ``s_a = d_a * sum(q_a)`` computed with the
# activations. Types whose scale group is 16 wide (Q2_K, Q3_K, Q6_K) do two
# K=32 dots per Q8_1 block, each with the other half of the activations
# zeroed, because an int8 ``tl.dot`` needs K >= 32 on the tensor cores.
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
    pairs, n = out.shape  # pairs, n and K > 0: the ops return empty outputs and K = 0's zeros
    k = xq.shape[1]
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
