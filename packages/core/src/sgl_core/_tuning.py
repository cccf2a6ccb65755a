"""One tuning object for every ``direct`` copy: which path a copy takes, per device.

Each copy of the direct movers (the token-row pools' ``RowDirectMover``,
``sgl_ascend``'s kv-split mover) and of ``sgl_cuda.kvcacheio``'s direct
functions picks its path by comparing block and run sizes with one
:class:`CopyTuning`. :func:`tuning_for` returns the preset of the device the
device pool lives on; a pool or a call given a ``CopyTuning`` uses that one
instead (tests pin a path that way). The preset values were measured
(BENCHMARKS.md, "Copy-path limits"); they are speed choices only: every path
moves the same bytes.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["CopyTuning", "NEVER", "tuning_for"]

#: A size no copy reaches: a limit set to it turns its path off.
NEVER = 1 << 62


@dataclasses.dataclass(frozen=True)
class CopyTuning:
    """Size limits, in bytes, that choose a direct copy's path.

    * ``stacked_min_run_bytes``: a backup whose device layers are equally
      spaced in one allocation copies each run across every layer at once
      when a run of one layer is at least this big.
    * ``by_address_min_block_bytes``: between two CPU buffers, blocks of one
      layer at least this big are copied by address (``memmove``).
    * ``gather_below_run_bytes``: runs of one layer shorter than this on
      average go through one gather and one scatter instead of slice copies.
    * ``gather_below_page_run_bytes``: the same choice for page-major copies
      (``page_first_kv_split``), where one run is a (pages x rows) block of
      every component and its bytes count over all the rows it moves; a
      gather there is another operation (over the page axis of 5-D tensors),
      so it has its own limit.
    * ``batched_cross_device``: between devices, issue every block in one
      non-blocking ``_foreach_copy_`` (host sides split into contiguous
      pieces) instead of one ``copy_`` per block.
    """

    stacked_min_run_bytes: int = 8 << 10
    by_address_min_block_bytes: int = 32 << 10
    gather_below_run_bytes: int = 96 << 10
    gather_below_page_run_bytes: int = 32 << 10
    batched_cross_device: bool = False


_PRESETS: dict[str, CopyTuning] = {
    # CPU device pools (the torch backend's default, and every backend's CPU fallback).
    "cpu": CopyTuning(),
    # A GPU and pinned host memory: each block is a DMA launch, gathers pay off longer.
    "cuda": CopyTuning(
        by_address_min_block_bytes=NEVER,
        gather_below_run_bytes=16 << 10,
        gather_below_page_run_bytes=256 << 10,
        batched_cross_device=True,
    ),
    # An NPU: every run is a DMA launch, so batch aggressively.
    "npu": CopyTuning(
        by_address_min_block_bytes=NEVER,
        gather_below_run_bytes=256 << 10,
        gather_below_page_run_bytes=256 << 10,
    ),
}


def tuning_for(device: torch.device) -> CopyTuning:
    """The preset for device pools on ``device`` (the CPU preset for unknown types)."""
    return _PRESETS.get(device.type, _PRESETS["cpu"])
