"""Group (token, expert) pairs by expert for the batched GGML kernel.

``moe_align_block_size`` in torch, without a host sync: every output size
depends only on the shapes, so it can run inside a CUDA graph.
"""

from __future__ import annotations

import torch

from sgl_core.errors import IndexDTypeError, IndexOutOfRangeError, ShapeMismatchError

__all__ = ["max_padded_pairs", "moe_align_block_size"]


def max_padded_pairs(pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded pair count: each used expert pads < ``block_m``."""
    return pairs + min(num_experts, pairs) * (block_m - 1)


def moe_align_block_size(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the flat pairs of ``topk_ids`` by expert, padding each expert to ``block_m``.

    Returns ``(sorted_ids, expert_ids, num_post_padded)``, all int32 on
    ``topk_ids``'s device:

    * ``sorted_ids (num_blocks * block_m,)``: pair indices ``t * top_k + k``
      (row-major flat index of ``topk_ids``) grouped by expert in expert order,
      pairs of one expert in their original order, each expert's run padded to
      a multiple of ``block_m`` with ``pairs`` (an out-of-range index);
      entries past the padded total are ``pairs`` too.
    * ``expert_ids (num_blocks,)``: the expert of each ``block_m`` block of
      ``sorted_ids``; ``-1`` for blocks past the padded total.
    * ``num_post_padded (1,)``: the padded total (a multiple of ``block_m``).

    ``num_blocks = ceil(max_padded_pairs(pairs, E, block_m) / block_m)``.
    Experts with no pairs take no block. Ids must lie in ``[0, num_experts)``:
    CPU ids are checked here (``IndexOutOfRangeError``); ids on an accelerator
    are not read back (no sync), so the caller validates them first (e.g.
    ``check_routing``), since an id out of range there is a device-side fault.
    """
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise IndexDTypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if block_m < 1 or num_experts < 1:
        raise ShapeMismatchError(
            f"block_m and num_experts must be >= 1, got {block_m} and {num_experts}"
        )
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    pairs = flat.numel()
    if dev.type == "cpu" and pairs:
        low, high = (int(v) for v in torch.aminmax(flat))
        if low < 0 or high >= num_experts:
            raise IndexOutOfRangeError(
                f"topk_ids holds {low if low < 0 else high}, outside [0, {num_experts})"
            )
    num_blocks = -(-max_padded_pairs(pairs, num_experts, block_m) // block_m)
    counts = torch.bincount(flat, minlength=num_experts)[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    cnt_start = torch.cumsum(counts, 0) - counts

    order = torch.sort(flat, stable=True).indices  # pair indices grouped by expert
    e_sorted = flat[order]
    pos = pad_start[e_sorted] + torch.arange(pairs, device=dev) - cnt_start[e_sorted]
    sorted_ids = torch.full((num_blocks * block_m,), pairs, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)

    # block b belongs to the expert whose padded run contains b * block_m
    block_start = torch.arange(num_blocks, device=dev) * block_m
    expert_ids = torch.searchsorted(pad_end, block_start, right=True)
    total = pad_end[-1:]  # num_experts >= 1 (checked above)
    expert_ids = torch.where(block_start < total, expert_ids, -1).to(torch.int32)
    return sorted_ids, expert_ids, total.to(torch.int32)
