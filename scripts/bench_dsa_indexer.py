"""The indexer's share of a DeepSeek-V3.2 host transfer (torch backend), interleaved.

Builds three pools side by side per (page size, layout) — DeepSeek-V3 (576 bf16
rows), DeepSeek-V3.2 rows only (656 uint8) and DeepSeek-V3.2 rows plus the
indexer cache (128 fp8 bytes + an fp32 scale per layer) — and times backup,
per-layer load and a contiguous copy of the same bytes round-robin, best of
``--repeats``. Prints GB/s and the ratio to the copy (see BENCHMARKS.md).

    PYTHONPATH=packages/core/src python scripts/bench_dsa_indexer.py [--tokens 2048]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

import sgl_core
from sgl_core.testing import page_indices

CONFIGS: dict[str, dict[str, Any]] = {
    "v3 bf16 576": {"dtype": torch.bfloat16},
    "v3.2 rows only": {"dtype": torch.uint8, "kv_cache_dim": 656},
    "v3.2 rows+indexer": {
        "dtype": torch.uint8,
        "kv_cache_dim": 656,
        "index_head_dim": 128,
        "with_index_k_scale": True,
    },
}
LAYERS = 61


def setup(layout: str, ps: int, n: int, options: dict[str, Any]) -> tuple[Any, ...]:
    backend = sgl_core.get_backend("torch")
    dev = backend.create_device_pool(
        size=2 * n, page_size=ps, kv_lora_rank=512, qk_rope_head_dim=64, layer_num=LAYERS,
        **options,
    )  # fmt: skip
    host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=2.0)
    gen = torch.Generator().manual_seed(ps)
    pages = torch.randperm(2 * n // ps, generator=gen)[: n // ps] + 1
    d_idx = page_indices(pages, ps)
    h_idx = page_indices(torch.randperm(host.size // ps, generator=gen)[: n // ps], ps)
    page = host.get_dummy_flat_data_page()
    nbytes = page.numel() * page.element_size() * (n // ps)
    src = torch.empty(nbytes, dtype=torch.uint8)
    return dev, host, h_idx, d_idx, nbytes, src, torch.empty_like(src)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for ps in (16, 64):
        for layout in ("layer_first", "page_first", "page_first_direct"):
            pools = {name: setup(layout, ps, args.tokens, opt) for name, opt in CONFIGS.items()}
            best = {(name, op): float("inf") for name in pools for op in ("backup", "load", "copy")}
            for _ in range(args.repeats):
                for name, (dev, host, h_idx, d_idx, _, src, dst) in pools.items():
                    t = time.perf_counter()
                    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
                    best[name, "backup"] = min(best[name, "backup"], time.perf_counter() - t)
                    t = time.perf_counter()
                    for layer in range(LAYERS):
                        host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "direct")
                    best[name, "load"] = min(best[name, "load"], time.perf_counter() - t)
                    t = time.perf_counter()
                    dst.copy_(src)
                    best[name, "copy"] = min(best[name, "copy"], time.perf_counter() - t)
            for name, pool in pools.items():
                nb, copy = pool[4], best[name, "copy"]
                line = [f"page {ps} {layout:18s} {name:18s} MB {nb / 1e6:6.1f}"]
                for op in ("backup", "load"):
                    s = best[name, op]
                    line.append(f"{op} {nb / s / 1e9:5.2f} GB/s ({copy / s:.2f}x copy)")
                line.append(f"copy {nb / copy / 1e9:5.2f}")
                print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
