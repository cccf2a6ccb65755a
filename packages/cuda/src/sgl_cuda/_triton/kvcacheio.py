"""Triton kernels that move MLA KV token rows between device and host buffers.

Every transfer of ``sgl_cuda.kvcacheio`` is one launch of :func:`_copy_rows_kernel`
over ``row blocks x layers`` programs. Each program copies ``BLOCK_R`` paired
rows of one layer as int64 words (``item_size // 8`` words a row), in column
chunks of ``BLOCK_W`` words. A row's address is::

    base(layer) + index * row_stride            (in int64 words)

where ``base(layer)`` is either a pointer table entry ``tbl[layer]`` (uint64
holding a byte address, converted to an ``int64*``) or a plain base pointer
plus ``layer * layer_stride``. That covers the three address forms of
docs/design.md section 5: layer-first, page-first and pointer table.

Programs run roughly in launch order, so the order decides which addresses are
touched together. By default the layers are the outer loop (a 2-D grid of
``(row blocks, layers)``). When one side is page-first (a token's layers sit
next to each other) ``LAYERS_INNER`` makes the layer the fastest-varying index
of a 1-D grid, so neighbouring programs touch neighbouring host memory rather
than rows a whole token stride apart.

This module is untyped (Triton ships no hints); ``sgl_cuda.kvcacheio`` is the
typed, checked surface. Nothing here validates arguments.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["INTERPRETED", "launch_copy_rows", "tile_for"]

# Rows x words of one program's tile (int64 elements) and the widest column chunk.
_TILE_ELEMS = 1024
_MAX_BLOCK_W = 128


@triton.jit
def _copy_rows_kernel(
    src,
    dst,
    src_idx,
    dst_idx,
    n_rows,
    layer_offset,
    num_layers,
    src_row_w,
    src_layer_w,
    dst_row_w,
    dst_layer_w,
    WORDS: tl.constexpr,
    SRC_TABLE: tl.constexpr,
    DST_TABLE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
    MASK_W: tl.constexpr,
    LAYERS_INNER: tl.constexpr,
):
    if LAYERS_INNER:
        pid = tl.program_id(0) // num_layers
        layer = (tl.program_id(0) % num_layers + layer_offset).to(tl.int64)
    else:
        pid = tl.program_id(0)
        layer = (tl.program_id(1) + layer_offset).to(tl.int64)
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < n_rows
    s = tl.load(src_idx + rows, mask=row_mask, other=0)
    d = tl.load(dst_idx + rows, mask=row_mask, other=0)

    if SRC_TABLE:
        src_base = tl.load(src + layer).to(tl.int64).to(tl.pointer_type(tl.int64))
    else:
        src_base = src.to(tl.pointer_type(tl.int64)) + layer * src_layer_w
    if DST_TABLE:
        dst_base = tl.load(dst + layer).to(tl.int64).to(tl.pointer_type(tl.int64))
    else:
        dst_base = dst.to(tl.pointer_type(tl.int64)) + layer * dst_layer_w

    src_rows = src_base + s * src_row_w
    dst_rows = dst_base + d * dst_row_w
    cols = tl.arange(0, BLOCK_W)
    for w0 in tl.static_range(0, WORDS, BLOCK_W):
        c = w0 + cols
        m = row_mask[:, None] & (c < WORDS)[None, :] if MASK_W else row_mask[:, None]
        v = tl.load(src_rows[:, None] + c[None, :], mask=m)
        tl.store(dst_rows[:, None] + c[None, :], v, mask=m)


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


def launch_copy_rows(
    src,
    dst,
    src_idx,
    dst_idx,
    *,
    words,
    layer_offset,
    num_layers,
    src_row_w,
    src_layer_w,
    dst_row_w,
    dst_layer_w,
    src_table,
    dst_table,
    block_r=None,
    block_w=None,
    num_warps=4,
    layers_inner=None,
):
    """One launch copying ``len(src_idx)`` rows of ``num_layers`` layers.

    The tile (``block_r`` rows x ``block_w`` words, powers of two), ``num_warps``
    and the grid order (``layers_inner``) default to :func:`tile_for` and the
    page-first rule; the GPU sweep passes them explicitly.
    """
    n = src_idx.numel()
    if n == 0 or num_layers == 0:
        return
    default_r, default_w, _ = tile_for(words)
    block_w = default_w if block_w is None else block_w
    block_r = default_r if block_r is None else block_r
    mask_w = words % block_w != 0
    if layers_inner is None:
        layers_inner = num_layers > 1 and (
            (not src_table and 0 < src_layer_w < src_row_w)
            or (not dst_table and 0 < dst_layer_w < dst_row_w)
        )
    if layers_inner:
        grid: tuple[int, ...] = (triton.cdiv(n, block_r) * num_layers,)
    else:
        grid = (triton.cdiv(n, block_r), num_layers)
    kwargs = {
        "WORDS": words,
        "SRC_TABLE": src_table,
        "DST_TABLE": dst_table,
        "BLOCK_R": block_r,
        "BLOCK_W": block_w,
        "MASK_W": mask_w,
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
        src_row_w,
        src_layer_w,
        dst_row_w,
        dst_layer_w,
    )
    if src_idx.device.type == "cuda":
        with torch.cuda.device(src_idx.device):
            _copy_rows_kernel[grid](*args, **kwargs)
    else:
        _copy_rows_kernel[grid](*args, **kwargs)
