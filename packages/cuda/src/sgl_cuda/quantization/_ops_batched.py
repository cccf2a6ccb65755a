"""Typed, validating wrapper of the batched ``ggml_moe_a8`` Triton kernel."""

from __future__ import annotations

import torch

from sgl_core.errors import (
    ArgumentTypeError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    ShapeMismatchError,
)
from sgl_cuda.quantization._ops import check_operands, check_runnable

__all__ = ["ggml_moe_a8", "ggml_moe_get_block_size"]

Tile = tuple[int, int, int, int]


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
    from sgl_cuda.quantization._types import resolve_quant_type

    qtype = resolve_quant_type(quant_type)
    if tile is not None:
        _check_tile(tile)
        return tile[0]
    from sgl_cuda._triton import ggml_mmq

    return ggml_mmq.default_tile(int(qtype))[0]


def _check_index(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise IndexDTypeError(f"{name} must be a torch.int32 tensor, got {got}")
    if t.dim() != 1:
        raise IndexShapeError(f"{name} must be 1-D, got shape {tuple(t.shape)}")


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
        _check_index(name, t)
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
    from sgl_cuda._triton import ggml as kernels
    from sgl_cuda._triton import ggml_mmq

    xq, xd, xs = kernels.quantize_q8_1_with_sums(x.contiguous())
    ggml_mmq.moe_a8_mmq(
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
        block_size=fmt.block_size,
        block_bytes=fmt.block_bytes,
        group_size=fmt.group_size,
        tile=tile if tile is not None else ggml_mmq.default_tile(int(qtype)),
    )
    return out
