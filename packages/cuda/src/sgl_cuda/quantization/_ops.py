"""Typed, validating wrappers of the GGML MoE Triton kernels: ``ggml_moe_a8_vec`` and the
batched ``ggml_moe_a8``."""

from __future__ import annotations

import dataclasses
import os

import torch

from sgl_core.errors import (
    ArgumentTypeError,
    BackendUnavailableError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    ShapeMismatchError,
)
from sgl_cuda.quantization._types import (
    BlockFormat,
    GGMLQuantType,
    block_format,
    resolve_quant_type,
)

__all__ = ["ggml_moe_a8", "ggml_moe_a8_vec", "ggml_moe_get_block_size"]

Tile = tuple[int, int, int, int]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_int32(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise IndexDTypeError(f"{name} must be a torch.int32 tensor, got {got}")


def check_runnable(device: torch.device) -> None:
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise BackendUnavailableError(
            "the GGML MoE kernels got CPU tensors: Triton runs them only under TRITON_INTERPRET=1 "
            "(set it before triton is imported); use dequantize_ggml for a CPU baseline"
        )


def check_operands(
    x: torch.Tensor,
    w: torch.Tensor,
    quant_type: int,
    row: int,
    top_k: int,
    tokens: int,
    index: torch.Tensor,
) -> tuple[GGMLQuantType, BlockFormat]:
    """Validate ``x``, ``w`` and the sizes both GGML MoE ops share; ``index`` is
    one of the op's index tensors (checked for device only)."""
    qtype = resolve_quant_type(quant_type)
    fmt = block_format(qtype)
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ArgumentTypeError("x and w must be torch.Tensor")
    if x.dtype not in _FLOAT_DTYPES:
        raise ArgumentTypeError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if w.dtype != torch.uint8:
        raise ArgumentTypeError(f"w must be uint8 GGUF block bytes, got {w.dtype}")
    if x.dim() != 2:
        raise ShapeMismatchError(f"x must be (tokens, K), got shape {tuple(x.shape)}")
    if w.dim() != 3:
        raise ShapeMismatchError(f"w must be (E, row, row_bytes), got shape {tuple(w.shape)}")
    if tokens != x.shape[0]:
        raise ShapeMismatchError(f"tokens={tokens} but x has {x.shape[0]} rows")
    if top_k < 1:
        raise ShapeMismatchError(f"top_k must be >= 1, got {top_k}")
    if row != w.shape[1]:
        raise ShapeMismatchError(f"row={row} but w has {w.shape[1]} rows per expert")
    k = x.shape[1]
    if k % fmt.block_size:
        raise ShapeMismatchError(
            f"K={k} (x.shape[1]) must be a multiple of the {qtype.name} block size {fmt.block_size}"
        )
    if w.shape[2] != fmt.row_bytes(k):
        raise ShapeMismatchError(
            f"w has {w.shape[2]} bytes per row; {qtype.name} rows of K={k} need "
            f"{k // fmt.block_size} blocks * {fmt.block_bytes} B = {fmt.row_bytes(k)}"
        )
    if not (x.device == w.device == index.device):
        raise ShapeMismatchError(
            f"x ({x.device}), w ({w.device}) and the index tensors ({index.device}) "
            "must share a device"
        )
    if w.shape[2] and w.stride(2) != 1:
        raise ShapeMismatchError("w's last dimension must be contiguous (stride 1)")
    if w.numel() and (w.data_ptr() % 2 or w.stride(0) % 2 or w.stride(1) % 2):
        # the kernels load each block's f16 scales as aligned 2-byte words
        raise ShapeMismatchError(
            "w must start at an even address with even strides (block f16 scales are "
            "loaded 2-byte aligned); copy it with w.clone()"
        )
    return qtype, fmt


def ggml_moe_a8_vec(
    x: torch.Tensor,
    w: torch.Tensor,
    topk_ids: torch.Tensor,
    top_k: int,
    quant_type: int,
    row: int,
    tokens: int,
    *,
    check_ids: bool = True,
) -> torch.Tensor:
    """Per token-expert pair mat-vec with GGUF-quantized expert weights.

    ``x (tokens, K)`` float16/bfloat16/float32; ``w (E, row, row_bytes)`` uint8
    GGUF blocks of type ``quant_type`` (a GGML type id, see
    :class:`GGMLQuantType`); ``topk_ids (tokens, top_k)`` int32, read flat.
    Returns ``Y (tokens * top_k, row)`` in ``x.dtype`` with
    ``Y[t * top_k + k] ~= dequant(w[topk_ids[t, k]]) @ x[t]``: activations are
    quantized to Q8_1 (blocks of 32, ``d = amax / 127``, ``q = round(x / d)``)
    and dotted in integers with the weight blocks, then scaled. No routing
    weight is applied and nothing is summed.

    ``check_ids`` verifies ``0 <= topk_ids < E`` on the host (one device sync);
    pass False only for ids already known to be in range.
    """
    _check_int32("topk_ids", topk_ids)
    qtype, fmt = check_operands(x, w, quant_type, row, top_k, tokens, topk_ids)
    if topk_ids.dim() not in (1, 2) or topk_ids.numel() != tokens * top_k:
        raise IndexShapeError(
            f"topk_ids must hold tokens*top_k={tokens * top_k} ids as (tokens, top_k), "
            f"got shape {tuple(topk_ids.shape)}"
        )
    if topk_ids.dim() == 2 and topk_ids.shape[1] != top_k:
        raise IndexShapeError(
            f"topk_ids must be (tokens, top_k={top_k}), got {tuple(topk_ids.shape)}"
        )
    num_experts = w.shape[0]
    ids = topk_ids.reshape(-1).contiguous()
    if check_ids and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_experts:
            raise IndexOutOfRangeError(
                f"topk_ids must lie in [0, {num_experts}), got range [{lo}, {hi}]"
            )

    out = torch.empty((tokens * top_k, row), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    check_runnable(x.device)
    if x.shape[1] == 0:  # K = 0: every dot product is empty
        return out.zero_()
    from sgl_cuda._triton import ggml as kernels

    xq, xd = kernels.quantize_q8_1(x.contiguous())
    kernels.moe_a8_vec(
        xq,
        xd,
        w,
        ids,
        out,
        top_k=top_k,
        quant_type=int(qtype),
        **dataclasses.asdict(fmt),  # block_size, block_bytes, group_size
    )
    return out


def _check_tile(tile: Tile) -> None:
    if not (
        isinstance(tile, tuple)
        and len(tile) == 4
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in tile)
    ):
        raise ArgumentTypeError(
            f"tile must be a tuple of 4 positive ints (BLOCK_M, BLOCK_N, BLOCK_K, num_warps), "
            f"got {tile!r}"
        )
    if any(v & (v - 1) for v in tile) or tile[2] % 32:
        raise ShapeMismatchError(
            f"tile sizes and num_warps must be powers of two and BLOCK_K a multiple of 32 "
            f"(one Q8_1 block), got {tile}"
        )


def ggml_moe_get_block_size(quant_type: int, tile: Tile | None = None) -> int:
    """The ``block_m`` to align pairs with for :func:`ggml_moe_a8` of ``quant_type``.

    That is the BLOCK_M of ``tile`` or of the type's default tile.
    """
    qtype = resolve_quant_type(quant_type)
    if tile is not None:
        _check_tile(tile)
        return tile[0]
    from sgl_cuda._triton import ggml as kernels

    return kernels.default_tile(int(qtype))[0]


def ggml_moe_a8(
    x: torch.Tensor,
    w: torch.Tensor,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    quant_type: int,
    row: int,
    top_k: int,
    tokens: int,
    *,
    tile: Tile | None = None,
    check_ids: bool = True,
) -> torch.Tensor:
    """Expert-grouped GGUF MoE matmul (upstream argument order).

    ``x (tokens, K)`` float16/bfloat16/float32, ``w (E, row, row_bytes)`` uint8
    GGUF blocks of ``quant_type``; the three index tensors (int32) come from
    :func:`moe_align_block_size` with ``block_m = ggml_moe_get_block_size``
    (``tile[0]`` when ``tile = (BLOCK_M, BLOCK_N, BLOCK_K, num_warps)`` is
    given). Returns ``Y (tokens * top_k, row)`` in ``x.dtype`` with
    ``Y[p] ~= dequant(w[e]) @ x[p // top_k]`` for every pair index ``p`` the
    sorted ids place in a block of expert ``e``; rows no block names are left
    uninitialized. Same Q8_1 numerics as :func:`ggml_moe_a8_vec`.

    ``check_ids`` verifies the index values on the host (one device sync):
    sorted ids in ``[0, tokens * top_k]`` (the top value is padding), expert
    ids in ``[-1, E)``.
    """
    for name, t in (
        ("sorted_token_ids", sorted_token_ids),
        ("expert_ids", expert_ids),
        ("num_tokens_post_padded", num_tokens_post_padded),
    ):
        _check_int32(name, t)
        if t.dim() != 1:
            raise IndexShapeError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    qtype, fmt = check_operands(x, w, quant_type, row, top_k, tokens, sorted_token_ids)
    if not (sorted_token_ids.device == expert_ids.device == num_tokens_post_padded.device):
        raise IndexShapeError("the index tensors must share x's device")
    block_m = ggml_moe_get_block_size(qtype, tile)
    if sorted_token_ids.numel() != expert_ids.numel() * block_m:
        raise IndexShapeError(
            f"sorted_token_ids ({sorted_token_ids.numel()}) must hold block_m={block_m} "
            f"ids per expert_ids entry ({expert_ids.numel()}); align with that block size"
        )
    if num_tokens_post_padded.numel() != 1:
        raise IndexShapeError(
            f"num_tokens_post_padded must hold one value, got {num_tokens_post_padded.numel()}"
        )
    pairs = tokens * top_k
    if check_ids and expert_ids.numel():
        s_lo, s_hi = int(sorted_token_ids.min()), int(sorted_token_ids.max())
        e_lo, e_hi = int(expert_ids.min()), int(expert_ids.max())
        if s_lo < 0 or s_hi > pairs or e_lo < -1 or e_hi >= w.shape[0]:
            raise IndexOutOfRangeError(
                f"sorted_token_ids must lie in [0, {pairs}] and expert_ids in "
                f"[-1, {w.shape[0]}), got [{s_lo}, {s_hi}] and [{e_lo}, {e_hi}]"
            )

    out = torch.empty((pairs, row), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    check_runnable(x.device)
    if x.shape[1] == 0:  # K = 0: every dot product is empty
        return out.zero_()
    from sgl_cuda._triton import ggml as kernels

    xq, xd, xs = kernels.quantize_q8_1_with_sums(x.contiguous())
    kernels.moe_a8_mmq(
        xq,
        xd,
        xs,
        w,
        sorted_token_ids.contiguous(),
        expert_ids.contiguous(),
        num_tokens_post_padded,
        out,
        top_k=top_k,
        quant_type=int(qtype),
        **dataclasses.asdict(fmt),  # block_size, block_bytes, group_size
        tile=tile if tile is not None else kernels.default_tile(int(qtype)),
    )
    return out
