"""Our storage backend loaded by SGLang's factory (``dynamic``), driven by the controller.

The controller's storage path runs on CPU: ``attach_storage_backend`` builds
the backend through ``StorageBackendFactory``, starts SGLang's real prefetch
and backup threads, and with one rank creates no process group (its sync
groups are skipped for a ``None`` tp group). SGLang reads the parallel layout
from its runtime context, so the controller is built inside
``get_parallel().override(...)`` stating a single rank.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.integrations.sglang import SGLangHostPool, wrap_host_pool
from sgl_core.integrations.sglang_storage import SGLangPageStorage
from sgl_core.l3 import FilePageStore

from sglang.srt.managers.cache_controller import HiCacheController  # isort: skip
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorage, HiCacheStorageConfig  # isort: skip
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool  # isort: skip
from sglang.srt.mem_cache.storage import StorageBackendFactory  # isort: skip
from sglang.srt.mem_cache.utils import get_hash_str  # isort: skip
from sglang.srt.runtime_context import get_parallel  # isort: skip

PAGE, LAYERS, RANK, ROPE = 4, 3, 8, 4
TIMEOUT = 30.0
SINGLE_RANK = {
    "tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1, "attn_dcp_size": 1,
    "attn_dcp_rank": 0, "attn_tp_rank": 0, "attn_tp_size": 1, "attn_dp_rank": 0,
}  # fmt: skip


def _extra(path: Path, interface_v1: int = 1) -> dict[str, Any]:
    return {
        "backend_name": "sgl_l3",
        "module_path": "sgl_core.integrations.sglang_storage",
        "class_name": "SGLangPageStorage",
        "interface_v1": interface_v1,
        "store": "file",
        "path": str(path),
    }


class _Allocator:
    def __init__(self, kvcache: Any) -> None:
        self.kvcache = kvcache

    def get_kvcache(self) -> Any:
        return self.kvcache

    def alloc(self, need: int) -> None:
        return None

    def set_hicache_transfer_done_event(self, key: object, event: object) -> None:
        pass


def _device_pool(seed: int) -> MLATokenToKVPool:
    pool = MLATokenToKVPool(
        size=64, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for layer in pool.kv_buffer:
        layer.copy_(torch.randn(layer.shape, generator=gen).to(layer.dtype))
    return pool


def _controller(
    dev: MLATokenToKVPool, host: SGLangHostPool, extra: dict[str, Any], model: str
) -> Any:
    with get_parallel().override(**SINGLE_RANK):
        return HiCacheController(
            _Allocator(dev),
            host,
            page_size=PAGE,
            tp_group=None,
            load_cache_event=threading.Event(),
            io_backend="kernel",
            storage_backend="dynamic",
            model_name=model,
            storage_backend_extra_config=dict(extra),
        )


def _flat_page(rows: list[torch.Tensor], layout: str) -> torch.Tensor:
    stacked = torch.stack(rows)
    return (stacked.transpose(0, 1) if layout == "page_first" else stacked).flatten()


def _prefetch(ctl: Any, host: SGLangHostPool, tokens: list[int]) -> tuple[int, torch.Tensor]:
    """SGLang's prefetch: hit query (prefetch thread), then page transfer (io thread)."""
    ctl.prefetch("req", tokens)
    op = ctl.prefetch_hit_queue.get(timeout=TIMEOUT)
    slots = host.alloc(len(tokens))
    assert slots is not None
    if op.storage_hit_count == 0:
        return 0, slots
    op.host_indices = slots
    ctl.prefetch_buffer.put(op)
    completed = 0
    while True:
        ack = ctl.ack_prefetch_queue.get(timeout=TIMEOUT)
        if ack.completed_tokens is not None:
            completed = ack.completed_tokens
        if ack.completed_req:
            return completed, slots


@pytest.mark.parametrize("interface_v1", [1, 0])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_controller_storage_roundtrip(tmp_path: Path, layout: str, interface_v1: int) -> None:
    dev = _device_pool(5)
    host = wrap_host_pool(sgl_core.get_backend("torch").create_host_pool(dev, layout=layout))
    ctl = _controller(dev, host, _extra(tmp_path / "l3", interface_v1), model="m1")
    try:
        assert isinstance(ctl.storage_backend, SGLangPageStorage)
        zero_copy = ctl.page_get_func.__func__ is HiCacheController._page_get_zero_copy
        assert zero_copy is bool(interface_v1)

        src = torch.tensor([8, 9, 10, 11, 36, 37, 38, 39])
        h_idx = host.alloc(8)
        assert h_idx is not None
        host.backup_from_device_all_layer(dev, h_idx, src, "kernel")
        tokens = [101, 102, 103, 104, 105, 106, 107, 108]
        keys = get_hash_str(tokens, None, page_size=PAGE)
        ctl.write_storage(h_idx, tokens, hash_value=keys)
        assert ctl.ack_backup_queue.get(timeout=TIMEOUT).completed_tokens == 8
        assert ctl.storage_backend.batch_exists(keys) == 2

        completed, slots = _prefetch(ctl, host, tokens)
        assert completed == 8
        for p in range(2):
            tok = src[p * PAGE : (p + 1) * PAGE]
            want = _flat_page([layer[tok] for layer in dev.kv_buffer], layout)
            assert torch.equal(host.get_data_page(int(slots[p * PAGE])), want)

        # Other tokens: a miss; the first page alone: a one-page hit.
        assert _prefetch(ctl, host, [1, 2, 3, 4, 5, 6, 7, 8])[0] == 0
        assert _prefetch(ctl, host, [*tokens[:4], 9, 9, 9, 9])[0] == 4
    finally:
        ctl.detach_storage_backend()

    # Another model over the same directory sees none of these pages.
    other = _controller(dev, host, _extra(tmp_path / "l3", interface_v1), model="m2")
    try:
        assert other.storage_backend.batch_exists(keys) == 0
    finally:
        other.detach_storage_backend()


def test_factory_builds_backend_and_backend_calls(tmp_path: Path) -> None:
    """The factory path alone, and the v1 and generic calls without the controller."""
    assert issubclass(SGLangPageStorage, HiCacheStorage)
    dev = _device_pool(6)
    host = wrap_host_pool(
        sgl_core.get_backend("torch").create_host_pool(dev, layout="page_first_direct")
    )
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=False,
        model_name="m", extra_config=_extra(tmp_path / "l3"),
    )  # fmt: skip
    backend = StorageBackendFactory.create_backend("dynamic", config, host)
    assert isinstance(backend, SGLangPageStorage)
    backend.register_mem_pool_host(host)

    h_idx = host.alloc(8)
    assert h_idx is not None
    host.backup_from_device_all_layer(dev, h_idx, torch.arange(12, 20), "direct")
    keys = get_hash_str(list(range(8)), None, page_size=PAGE)
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, h_idx) == [True, True]
    assert backend.batch_exists(keys) == 2 and backend.exists(keys[1])
    back = host.alloc(8)
    assert back is not None
    assert backend.batch_get_v1(keys, back) == [True, True]
    for p in range(2):
        assert torch.equal(
            host.get_data_page(int(back[p * PAGE])), host.get_data_page(int(h_idx[p * PAGE]))
        )

    # Generic (flat page) calls: SGLang's pre-v1 path.
    pages = [host.get_dummy_flat_data_page() for _ in keys]
    got = backend.batch_get(keys, pages)
    assert all(g is t for g, t in zip(got, pages, strict=True))
    assert torch.equal(pages[0], host.get_data_page(int(h_idx[0])))
    other = get_hash_str(list(range(100, 104)), None, page_size=PAGE)
    assert backend.batch_get(other, [host.get_dummy_flat_data_page()]) == [None]
    assert backend.batch_set(other, [pages[1]])
    assert torch.equal(backend.get(other[0]), pages[1])
    assert host.available_size() == host.size - 16  # the bounce pages were freed
    assert backend.get_stats().pages_set == 3
    backend.clear()
    assert backend.batch_exists(keys) == 0


def _rank_configs(path: Path) -> dict[str, HiCacheStorageConfig]:
    """SGLang's own storage configs for ranks of MLA and MHA deployments."""
    one = {"tp_rank": 0, "tp_size": 1, "pp_rank": 0, "pp_size": 1, "attn_cp_rank": 0,
           "attn_cp_size": 1}  # fmt: skip
    shapes: dict[str, dict[str, Any]] = {
        "tp1": {},
        "tp2r0": {"tp_size": 2},
        "tp2r1": {"tp_rank": 1, "tp_size": 2},
        "pp2r0": {"pp_size": 2},
        "pp2r1": {"pp_rank": 1, "pp_size": 2},
        "cp2r0": {"attn_cp_size": 2},
        "cp2r1": {"attn_cp_rank": 1, "attn_cp_size": 2},
        "tp2r1cp2r1": {"tp_rank": 1, "tp_size": 2, "attn_cp_rank": 1, "attn_cp_size": 2},
        "tp2r1pp2r1cp2r0": {
            "tp_rank": 1,
            "tp_size": 2,
            "pp_rank": 1,
            "pp_size": 2,
            "attn_cp_size": 2,
        },
    }
    dcp = {  # SGLang allows DCP for MLA only
        "tp2dcp2r0": {"tp_size": 2, "dcp_size": 2},
        "tp2dcp2r1": {"tp_rank": 1, "tp_size": 2, "dcp_size": 2, "dcp_rank": 1},
        "tp4dcp2r0": {"tp_size": 4, "dcp_size": 2},
        "tp4dcp2r2": {"tp_rank": 2, "tp_size": 4, "dcp_size": 2},
        "tp4dcp2r3": {"tp_rank": 3, "tp_size": 4, "dcp_size": 2, "dcp_rank": 1},
        "tp4dcp2r3cp2r1": {
            "tp_rank": 3,
            "tp_size": 4,
            "dcp_size": 2,
            "dcp_rank": 1,
            "attn_cp_rank": 1,
            "attn_cp_size": 2,
        },
    }
    configs = {}
    for mla in (True, False):
        for name, fields in [*shapes.items(), *(dcp.items() if mla else [])]:
            extra = {"logical_page_size": PAGE} if "dcp_size" in fields else {}
            configs[("mla-" if mla else "mha-") + name] = HiCacheStorageConfig(
                **{**one, **fields, **extra}, is_mla_model=mla, enable_storage_metrics=False,
                is_page_first_layout=True, model_name="m",
                extra_config={"file_storage_path": str(path)},
            )  # fmt: skip
    return configs


def test_keys_across_ranks_match_sglangs_sharing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pair of ranks (TP/PP/attention CP/DCP, MLA and MHA), with SGLang's configs.

    A rank sees another rank's pages exactly when SGLang's own ``HiCacheFile``
    backend would give both the same file (same ``config_suffix``): ranks whose
    bytes differ miss (``batch_exists == 0``, nothing loaded), replicas hit.
    """
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    configs = _rank_configs(tmp_path / "sglang-file")
    sglang_suffix = {n: HiCacheFile(c).config_suffix for n, c in configs.items()}
    dev = _device_pool(7)
    host = wrap_host_pool(
        sgl_core.get_backend("torch").create_host_pool(dev, layout="page_first_direct")
    )
    store = FilePageStore(str(tmp_path / "l3"))
    backends = {}
    for name, config in configs.items():
        backend = SGLangPageStorage(config, {}, store=store)  # one store, shared by all ranks
        backend.register_mem_pool_host(host)
        backends[name] = backend
    src = host.alloc(2 * PAGE)
    dst = host.alloc(PAGE)
    assert src is not None and dst is not None
    host.backup_from_device_all_layer(dev, src, torch.arange(8, 8 + 2 * PAGE), "direct")
    written = {}
    for i, (name, backend) in enumerate(backends.items()):
        keys = get_hash_str(list(range(100 * i, 100 * i + 2 * PAGE)), None, page_size=PAGE)
        assert backend.batch_set_v1(keys, src) == [True, True]
        written[name] = keys
    shared_pairs = 0
    for writer, keys in written.items():
        for reader, backend in backends.items():
            shared = sglang_suffix[writer] == sglang_suffix[reader]
            shared_pairs += shared and writer != reader
            host.get_data_page(int(dst[0])).zero_()
            before = host.get_data_page(int(dst[0])).clone()
            assert backend.batch_exists(keys) == (2 if shared else 0), (writer, reader)
            assert backend.batch_get_v1(keys[:1], dst) == [shared], (writer, reader)
            want = host.get_data_page(int(src[0])) if shared else before
            assert torch.equal(host.get_data_page(int(dst[0])), want), (writer, reader)
    # MLA TP replicas (and DCP shards of equal rank across DCP groups) share, as in SGLang.
    assert (
        shared_pairs > 0 and backends["mla-tp4dcp2r2"].batch_exists(written["mla-tp4dcp2r0"]) == 2
    )
