"""The ``sgl-bench`` console script: host KV-cache transfer and MoE benchmarks.

``sgl-bench hicache`` measures host-pool backup/load bandwidth of every
selected backend against one contiguous copy of the same bytes (the limit)
and plain baselines; ``sgl-bench moe`` measures the MoE combine and checks the
MoE methods. Entry point: :func:`sgl_core.cli.main.main`. ``rich`` and
``matplotlib`` (the ``bench`` extra) are optional and imported lazily.
"""

from __future__ import annotations

__all__: list[str] = []
