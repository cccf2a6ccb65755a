"""One tuning object for every ``direct`` copy: which path a copy takes, per device.

Each direct copy picks its path by comparing block and run sizes with one
:class:`CopyTuning`: the preset of the device pool's device
(:func:`tuning_for`), or the one a pool or call is given (docs/design.md;
the preset values were measured, BENCHMARKS.md "Copy-path limits"). They
are speed choices only: every path moves the same bytes.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["AUTO", "AUTO_MIN_BYTES", "CopyTuning", "NEVER", "tuning_for"]

#: A size no copy reaches: a limit set to it turns its path off.
NEVER = 1 << 62
#: ``CopyTuning.copy_threads``: measure which thread count is fastest
#: (``sgl_core.transfer.copy._calibrate``).
AUTO = -1
#: With ``AUTO``, a CPU copy call moving less than this takes one thread without measuring.
AUTO_MIN_BYTES = 1 << 20


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
    * ``load_gather_below_run_bytes``: the same choice for a per-layer load
      between two CPU buffers, whose slice copies are numpy slices (far
      cheaper per run than torch views, so they pay off at shorter runs);
      None: ``gather_below_run_bytes``.
    * ``gather_below_page_run_bytes``: the same choice for page-major copies
      (``page_first_kv_split``), where one run is a (pages x rows) block of
      every component and its bytes count over all the rows it moves; a
      gather there is another operation (over the page axis of 5-D tensors),
      so it has its own limit.
    * ``batched_cross_device``: between devices, issue every block in one
      non-blocking ``_foreach_copy_`` (host sides split into contiguous
      pieces) instead of one ``copy_`` per block.
    * ``copy_threads``: how copies between two CPU buffers use threads.
      ``AUTO`` (the default): measured per kind of copy (``copy_calibration()``
      says what was chosen and why). 0: ATen's own threads (an OpenMP team
      per block above its grain). n >= 1: pieces below the grain over n
      threads of our own (1: the calling thread only).
    """

    stacked_min_run_bytes: int = 8 << 10
    by_address_min_block_bytes: int = 32 << 10
    gather_below_run_bytes: int = 96 << 10
    load_gather_below_run_bytes: int | None = None
    gather_below_page_run_bytes: int = 32 << 10
    batched_cross_device: bool = False
    copy_threads: int = AUTO

    def __post_init__(self) -> None:
        if self.copy_threads < AUTO:
            raise ValueError(
                f"copy_threads must be AUTO (-1), 0 or positive, got {self.copy_threads}"
            )


_PRESETS: dict[str, CopyTuning] = {
    # CPU device pools (the torch backend's default, and every backend's CPU fallback).
    "cpu": CopyTuning(load_gather_below_run_bytes=4 << 10),
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
