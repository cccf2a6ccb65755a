"""Triton kernel that moves KV token rows (MLA rows, MHA K and V) between device and host.

Every transfer of ``sgl_cuda.kvcacheio`` is one launch of :func:`_copy_rows_kernel`.
A program copies ``BLOCK_R`` paired rows of one layer of one component (K or V;
MLA is K only) as int64 words, in column chunks of ``BLOCK_W`` words. The
component is the last grid axis: V's base is K's base plus ``*_v_delta`` (in
8-byte units, computed by the caller), so K and V share one launch.

Word ``c`` of a row (``index``, ``layer``) lives at::

    base(layer) + index * row_stride + c                       (plain side)
    base(layer) + (index // page_size) * page_stride
                + (index % page_size) * row_stride
                + (c // HEAD_WORDS) * head_stride + c % HEAD_WORDS   (page-head side)

``base(layer)`` is a pointer table entry ``tbl[layer]`` or a plain base plus
``layer * layer_stride``: layer-first, page-first, pointer table and the
``(page_num, head_num, page_size, layer_num, head_dim)`` page-head host layout
(docs/design.md section 5).

Programs run roughly in launch order. When one side is page-first or page-head
(a token's layers sit next to each other) ``LAYERS_INNER`` makes the layer the
fastest-varying index of the grid, so neighbouring programs touch neighbouring
host memory. Untyped (Triton ships no hints); ``sgl_cuda.kvcacheio`` checks the
arguments.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["INTERPRETED", "launch_copy_kv_rows", "launch_copy_rows", "tile_for"]

# Rows x words of one program's tile (int64 elements) and the widest column chunk.
_TILE_ELEMS = 1024
_MAX_BLOCK_W = 128


@triton.jit
def _row_words(base, idx, c, row_w, page_w, head_w, ps, HEAD_WORDS: tl.constexpr, PH: tl.constexpr):
    """Pointers to words ``c`` (columns) of rows ``idx`` (a column vector)."""
    if PH:
        row = base + (idx // ps) * page_w + (idx % ps) * row_w
        col = (c // HEAD_WORDS).to(tl.int64) * head_w + c % HEAD_WORDS
    else:
        row = base + idx * row_w
        col = c.to(tl.int64)
    return row[:, None] + col[None, :]


@triton.jit
def _layer_base(ptr, v_delta, layer, layer_w, TABLE: tl.constexpr):
    """Word pointer to the start of ``layer`` (of K, or V ``v_delta`` words on)."""
    if TABLE:
        base = tl.load(ptr + v_delta + layer).to(tl.int64).to(tl.pointer_type(tl.int64))
    else:
        base = ptr.to(tl.pointer_type(tl.int64)) + v_delta + layer * layer_w
    return base


@triton.jit
def _copy_rows_kernel(
    src,
    dst,
    src_idx,
    dst_idx,
    n_rows,
    layer_offset,
    num_layers,
    src_v_delta,
    dst_v_delta,
    src_row_w,
    src_layer_w,
    src_page_w,
    src_head_w,
    src_ps,
    dst_row_w,
    dst_layer_w,
    dst_page_w,
    dst_head_w,
    dst_ps,
    WORDS: tl.constexpr,
    HEAD_WORDS: tl.constexpr,
    SRC_TABLE: tl.constexpr,
    DST_TABLE: tl.constexpr,
    SRC_PH: tl.constexpr,
    DST_PH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
    MASK_W: tl.constexpr,
    LAYERS_INNER: tl.constexpr,
):
    if LAYERS_INNER:
        pid = tl.program_id(0) // num_layers
        layer = (tl.program_id(0) % num_layers + layer_offset).to(tl.int64)
        kv = tl.program_id(1).to(tl.int64)
    else:
        pid = tl.program_id(0)
        layer = (tl.program_id(1) + layer_offset).to(tl.int64)
        kv = tl.program_id(2).to(tl.int64)
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < n_rows
    s = tl.load(src_idx + rows, mask=row_mask, other=0)
    d = tl.load(dst_idx + rows, mask=row_mask, other=0)

    src_base = _layer_base(src, kv * src_v_delta, layer, src_layer_w, SRC_TABLE)
    dst_base = _layer_base(dst, kv * dst_v_delta, layer, dst_layer_w, DST_TABLE)

    cols = tl.arange(0, BLOCK_W)
    for w0 in tl.static_range(0, WORDS, BLOCK_W):
        c = w0 + cols
        m = row_mask[:, None] & (c < WORDS)[None, :] if MASK_W else row_mask[:, None]
        src_p = _row_words(
            src_base, s, c, src_row_w, src_page_w, src_head_w, src_ps, HEAD_WORDS, SRC_PH
        )
        dst_p = _row_words(
            dst_base, d, c, dst_row_w, dst_page_w, dst_head_w, dst_ps, HEAD_WORDS, DST_PH
        )
        tl.store(dst_p, tl.load(src_p, mask=m), mask=m)


INTERPRETED: bool = type(_copy_rows_kernel).__name__ == "InterpretedFunction"


def tile_for(words):
    """``(BLOCK_R, BLOCK_W, MASK_W)`` for rows of ``words`` int64 words."""
    if words <= _MAX_BLOCK_W:
        block_w = triton.next_power_of_2(words)
    else:
        # The widest power of two that divides the row: no masked lanes.
        block_w = min(words & -words, 64)
        if block_w < 16:
            block_w = 64
    block_r = max(1, min(64, _TILE_ELEMS // block_w))
    return block_r, block_w, words % block_w != 0


def launch_copy_kv_rows(
    src,
    dst,
    src_idx,
    dst_idx,
    *,
    words,
    head_words,
    layer_offset,
    num_layers,
    src_v_delta,
    dst_v_delta,
    src_side,
    dst_side,
    src_table,
    dst_table,
    components=2,
    block_r=None,
    block_w=None,
    num_warps=4,
    layers_inner=None,
):
    """One launch copying ``len(src_idx)`` K and V rows of ``num_layers`` layers.

    ``src``/``dst`` are K's buffer or pointer table; ``*_v_delta`` is V's minus
    K's address in 8-byte units (``components=1``: K only, the deltas unused).
    A side is ``(row_w, layer_w, page_w, head_w, page_size, page_head)`` in
    int64 words (``page_w``, ``head_w``, ``page_size`` count only for page_head).
    The tile (powers of two), ``num_warps`` and the grid order default to
    :func:`tile_for` and the page-first rule; the GPU sweep passes them explicitly.
    """
    n = src_idx.numel()
    if n == 0 or num_layers == 0:
        return
    default_r, default_w, _ = tile_for(words)
    block_w = default_w if block_w is None else block_w
    block_r = default_r if block_r is None else block_r
    if layers_inner is None:
        layers_inner = num_layers > 1 and any(
            not table and 0 < side[1] < side[0]
            for table, side in ((src_table, src_side), (dst_table, dst_side))
        )
    blocks = triton.cdiv(n, block_r)
    if layers_inner:
        grid: tuple[int, ...] = (blocks * num_layers, components)
    else:
        grid = (blocks, num_layers, components)
    kwargs = {
        "WORDS": words,
        "HEAD_WORDS": head_words,
        "SRC_TABLE": src_table,
        "DST_TABLE": dst_table,
        "SRC_PH": bool(src_side[5]),
        "DST_PH": bool(dst_side[5]),
        "BLOCK_R": block_r,
        "BLOCK_W": block_w,
        "MASK_W": words % block_w != 0,
        "LAYERS_INNER": layers_inner,
    }
    if not INTERPRETED:
        kwargs["num_warps"] = num_warps
    args = (
        src,
        dst,
        src_idx,
        dst_idx,
        n,
        layer_offset,
        num_layers,
        src_v_delta,
        dst_v_delta,
        *src_side[:5],
        *dst_side[:5],
    )
    if src_idx.device.type == "cuda":
        with torch.cuda.device(src_idx.device):
            _copy_rows_kernel[grid](*args, **kwargs)
    else:
        _copy_rows_kernel[grid](*args, **kwargs)


def launch_copy_rows(
    src, dst, src_idx, dst_idx, *, src_row_w, src_layer_w, dst_row_w, dst_layer_w, **kw
):
    """One-component (MLA) :func:`launch_copy_kv_rows` over plain or table sides."""
    launch_copy_kv_rows(
        src,
        dst,
        src_idx,
        dst_idx,
        head_words=kw["words"],
        src_v_delta=0,
        dst_v_delta=0,
        src_side=(src_row_w, src_layer_w, 0, 0, 1, False),
        dst_side=(dst_row_w, dst_layer_w, 0, 0, 1, False),
        components=1,
        **kw,
    )
