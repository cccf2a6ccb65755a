"""SGLang's default HiCache stack as its server builds it (shared by the default-stack tests).

See test_sglang_default_stack.py for what runs and what is stood in for.
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # isort: skip
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams  # isort: skip
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # isort: skip
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool  # isort: skip
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool  # isort: skip
from sglang.srt.mem_cache.radix_cache import RadixKey  # isort: skip
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_unified_radix_cache  # isort: skip
from sglang.srt.runtime_context import get_context, get_parallel  # isort: skip
from sglang.srt.server_args import prepare_server_args  # isort: skip

PAGE, LAYERS, SLOTS = 4, 3, 64
TOKENS = list(range(100, 116))  # four pages
SINGLE_RANK = {
    "tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1, "attn_dcp_size": 1,
    "attn_dcp_rank": 0, "attn_tp_rank": 0, "attn_tp_size": 1, "attn_dp_rank": 0,
}  # fmt: skip
# A liveness guard, not a time limit: the first storage call of a process loads
# SGLang's native hash extension (a torch cpp_extension, behind a file lock shared
# by every process on the machine), which took over 30 s on 2 busy cores.
TIMEOUT = 120.0


def flags(path: Path, layout: str, io: str) -> list[str]:
    extra = {
        "backend_name": "sgl_l3",
        "module_path": "sgl_core.integrations.sglang_storage",
        "class_name": "SGLangPageStorage",
        "interface_v1": 1,
        "store": "file",
        "path": str(path),
        "prefetch_threshold": PAGE,
    }
    return [
        "--model-path", "unused", "--device", "cpu", "--page-size", str(PAGE),
        "--enable-hierarchical-cache", "--hicache-ratio", "2",
        "--hicache-mem-layout", layout, "--hicache-io-backend", io,
        "--hicache-write-policy", "write_through",
        "--hicache-storage-prefetch-policy", "wait_complete",
        "--hicache-storage-backend", "dynamic",
        "--hicache-storage-backend-extra-config", json.dumps(extra),
    ]  # fmt: skip


def mla() -> MLATokenToKVPool:
    return MLATokenToKVPool(
        size=SLOTS, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=8,
        qk_rope_head_dim=4, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )  # fmt: skip


def mha(v_head_dim: int | None = None) -> Callable[[], MHATokenToKVPool]:
    def make() -> MHATokenToKVPool:
        return MHATokenToKVPool(
            size=SLOTS, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8,
            layer_num=LAYERS, device="cpu", enable_memory_saver=False, v_head_dim=v_head_dim,
        )  # fmt: skip

    return make


DSA_PAGE, DSA_LAYERS, DSA_KEY = 64, 3, 128
DSA_SKIP = [False, True, False]  # layer 1 reuses layer 0's top-k: a 0-page placeholder
DSA_LIVE = (0, 2)


def dsa(seed: int = 7, pages: int = 4, skip: list[bool] | None = DSA_SKIP) -> DSATokenToKVPool:
    """A DeepSeek-V3.2 pool (packed fp8 KV rows, paged indexer) of random bytes."""
    with get_parallel().override(**SINGLE_RANK):
        dev = DSATokenToKVPool(
            size=pages * DSA_PAGE, page_size=DSA_PAGE, kv_lora_rank=512,
            dtype=torch.float8_e4m3fn, qk_rope_head_dim=64, layer_num=DSA_LAYERS,
            device="cpu", index_head_dim=DSA_KEY, enable_memory_saver=False,
            kv_cache_dim=656, skip_topk_layers=skip,
        )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for t in dev.kv_buffer + dev.index_k_with_scale_buffer:
        raw = torch.randint(0, 256, (t.nbytes,), dtype=torch.uint8, generator=gen)
        t.view(torch.uint8).view(-1).copy_(raw)
    return dev


def dsa_state(dev: DSATokenToKVPool) -> list[torch.Tensor]:
    """Copies of every byte of ``dev``: KV rows per layer, then index pages per layer."""
    return [t.view(torch.uint8).clone() for t in dev.kv_buffer + dev.index_k_with_scale_buffer]


def device_buffers(dev: Any) -> list[torch.Tensor]:
    return (
        list(dev.kv_buffer) if isinstance(dev, MLATokenToKVPool) else [*dev.k_buffer, *dev.v_buffer]
    )


def fill(dev: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for buf in device_buffers(dev):
        buf.copy_(torch.randn(buf.shape, generator=gen).to(buf.dtype))


class Worker:
    """The scheduler's tp_worker: only records the layer counter SGLang hands it."""

    def register_hicache_layer_transfer_counter(self, counter: object) -> None:
        self.counter = counter


def build(dev: Any, flags: list[str], *, page: int = PAGE, is_dsa: bool = False) -> tuple[Any, Any]:
    """The scheduler's cache from SGLang's own parsed flags (``--page-size`` set to ``page``)."""
    flags = list(flags)
    flags[flags.index("--page-size") + 1] = str(page)
    server_args = prepare_server_args(flags)
    get_context().set_server_args(server_args)
    slots = dev.size
    allocator = PagedTokenToKVPoolAllocator(slots, page, dev.dtype, "cpu", dev, need_sort=False)
    req_to_token = ReqToTokenPool(
        size=4, max_context_len=slots, device="cpu", enable_memory_saver=False
    )
    params = CacheInitParams(
        disable=False, req_to_token_pool=req_to_token,
        token_to_kv_pool_allocator=allocator, page_size=page,
    )  # fmt: skip
    ctx = TreeCacheBuildContext(
        server_args=server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
        enable_hierarchical_cache=True, disable_radix_cache=False, tp_worker=Worker(),
        model_config=None, tp_size=1, tp_rank=0, tp_group=None, is_dsa=is_dsa,
    )  # fmt: skip
    return create_unified_radix_cache(ctx), allocator


def until(step: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not step():
        assert time.monotonic() < deadline, "SGLang's controller did not finish"
        time.sleep(0.01)


def match(cache: Any, tokens: list[int] = TOKENS) -> Any:
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))


def load_back(cache: Any, node: Any, tokens: list[int] = TOKENS) -> torch.Tensor:
    assert cache.load_back(node)
    cache.cache_controller.start_loading()

    def done() -> bool:
        cache.loading_check()
        return not cache.ongoing_load_back

    until(done)
    m = match(cache, tokens)
    assert (m.device_prefix_len, m.host_hit_length) == (len(tokens), 0)
    indices: torch.Tensor = cache.path_device_indices(m.last_device_node)
    return indices
