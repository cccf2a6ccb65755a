"""SGLang adapters: the exact store keys per shard and the wrapper's size members (issue #24).

The storage backend is driven through its public calls over a recording
store (``store=``), so the exact key each rank asks for is checked: the page
hash, the escaped model name, one part per shard dimension where ranks' bytes
differ (TP for MHA, PP, attention CP, DCP; MLA shares TP ranks) and the host
layout. Every field is checked at its bounds. The wrapper's size members are
compared with SGLang's own formulas for the same pool (kv_cache_dim * itemsize
per layer, page bytes = size_per_token * page_size).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.errors import ArgumentTypeError
from sgl_core.integrations.sglang import SGLangHostPool, wrap_host_pool
from sgl_core.integrations.sglang_storage import (
    SGLangPageStorage,
    rank_root_name,
    shard_key_parts,
)
from sgl_core.l3 import PageStoreArgumentError

PS = 4
ONE_RANK: dict[str, Any] = dict(
    is_mla_model=True, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
    attn_cp_size=1, dcp_rank=0, dcp_size=1, logical_page_size=None,
)  # fmt: skip


class RecordingStore:
    """A page store double: records every call; ``hits`` pages exist, gets/sets succeed."""

    def __init__(self, hits: int = 0) -> None:
        self.calls: list[tuple[str, list[Any]]] = []
        self.hits = hits
        self.registered: list[Any] = []

    def register_host_pool(self, host: Any) -> None:
        self.registered.append(host)

    def batch_exists(self, keys: Sequence[str]) -> int:
        self.calls.append(("exists", list(keys)))
        return min(self.hits, len(keys))

    def batch_get(self, keys: Sequence[str], host_indices: Any) -> list[bool]:
        self.calls.append(("get", list(keys)))
        return [True] * len(keys)

    def batch_set(self, keys: Sequence[str], host_indices: Any) -> list[bool]:
        self.calls.append(("set", list(keys)))
        return [True] * len(keys)


def config(model: object = "m", **fields: Any) -> Any:
    return types.SimpleNamespace(model_name=model, extra_config={}, **{**ONE_RANK, **fields})


def host(layout: str = "page_first", **options: Any) -> Any:
    opts: dict[str, Any] = {"dtype": torch.bfloat16, **options}
    dev = sgl_core.get_backend("torch").create_device_pool(
        size=4 * PS, page_size=PS, kv_lora_rank=16, qk_rope_head_dim=8, layer_num=3, **opts
    )
    return sgl_core.get_backend("torch").create_host_pool(dev, layout=layout)


def keys_asked(cfg: Any, keys: list[Any], layout: str = "page_first") -> list[Any]:
    store = RecordingStore()
    backend = SGLangPageStorage(cfg, {}, store=store)  # type: ignore[arg-type]
    wrapped = wrap_host_pool(host(layout))
    backend.register_mem_pool_host(wrapped)
    assert store.registered == [wrapped.pool]
    backend.batch_exists(keys)
    (call,) = store.calls
    return call[1]


# (fields, suffix after "h@m") for MLA (is_mla_model=True) and MHA (False)
SUFFIXES = [
    ({}, ""),
    ({"tp_rank": 1, "tp_size": 2}, ""),  # MLA: TP ranks share pages
    ({"is_mla_model": False}, "@tp0of1"),
    ({"is_mla_model": False, "tp_rank": 1, "tp_size": 2}, "@tp1of2"),
    ({"is_mla_model": False, "tp_rank": 3, "tp_size": 4}, "@tp3of4"),
    ({"pp_rank": 1, "pp_size": 2}, "@pp1of2"),
    ({"pp_rank": 0, "pp_size": 2}, "@pp0of2"),
    ({"attn_cp_rank": 1, "attn_cp_size": 2}, "@cp1of2"),
    ({"attn_cp_rank": 2, "attn_cp_size": 3}, "@cp2of3"),
    ({"dcp_rank": 1, "dcp_size": 2, "tp_size": 2, "logical_page_size": 1}, "@dcp1of2tp2page1"),
    ({"dcp_rank": 0, "dcp_size": 2, "tp_size": 4, "logical_page_size": 64}, "@dcp0of2tp4page64"),
    (
        {"is_mla_model": False, "tp_rank": 1, "tp_size": 2, "pp_rank": 2, "pp_size": 3,
         "attn_cp_rank": 1, "attn_cp_size": 2, "dcp_rank": 1, "dcp_size": 2,
         "logical_page_size": 8},
        "@tp1of2@pp2of3@cp1of2@dcp1of2tp2page8",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "suffix"), SUFFIXES)
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_each_rank_asks_for_its_exact_keys(
    fields: dict[str, Any], suffix: str, layout: str
) -> None:
    asked = keys_asked(config(**fields), ["h1", "h2"], layout)
    assert asked == [f"h1@m{suffix}@{layout}", f"h2@m{suffix}@{layout}"]
    parts = [p for p in suffix.split("@") if p]
    assert shard_key_parts(config(**fields)) == parts


@pytest.mark.parametrize(
    ("model", "name"),
    [("a@b%c", "a%40b%25c"), ("%40", "%2540"), (None, "-"), ("", "-"), (7, "7")],
)
def test_model_names_are_escaped_and_defaulted(model: object, name: str) -> None:
    assert keys_asked(config(model), ["h"]) == [f"h@{name}@page_first"]


def test_keys_that_are_not_page_hashes_pass_through_for_the_store_to_refuse() -> None:
    assert keys_asked(config(), ["", "h", 5]) == ["", "h@m@page_first", 5]


def test_exists_batch_exists_and_the_empty_batch() -> None:
    store = RecordingStore(hits=1)
    backend = SGLangPageStorage(config(), {}, store=store)  # type: ignore[arg-type]
    backend.register_mem_pool_host(wrap_host_pool(host()))
    assert backend.batch_exists([]) == 0 and store.calls == []  # no store call at all
    assert backend.exists("h") is True
    assert store.calls == [("exists", ["h@m@page_first"])]
    store.hits = 0
    assert backend.exists("h") is False
    assert backend.batch_exists(["a", "b"]) == 0
    store.hits = 2
    assert backend.batch_exists(["a", "b", "c"]) == 2
    with pytest.raises(PageStoreArgumentError, match="one str"):
        backend.batch_exists("ab")
    idx = torch.arange(PS)
    assert backend.batch_get_v1(["g"], idx) == [True]
    assert backend.batch_set_v1(["s"], idx) == [True]
    assert store.calls[-2:] == [("get", ["g@m@page_first"]), ("set", ["s@m@page_first"])]


def test_register_refuses_an_unwrapped_pool_and_binds_nothing() -> None:
    store = RecordingStore()
    backend = SGLangPageStorage(config(), {}, store=store)  # type: ignore[arg-type]
    with pytest.raises(PageStoreArgumentError, match="wrap_host_pool"):
        backend.register_mem_pool_host(host())  # type: ignore[arg-type]
    assert store.registered == [] and backend.mem_pool_host is None
    wrapped = wrap_host_pool(host("layer_first"))
    backend.register_mem_pool_host(wrapped)
    assert backend.mem_pool_host is wrapped and store.registered == [wrapped.pool]
    assert backend.store is store


@pytest.mark.parametrize(
    "fields",
    [
        {"tp_rank": 1},  # rank == size
        {"tp_rank": -1},
        {"tp_size": 0},
        {"pp_rank": 2, "pp_size": 2},
        {"pp_size": 0},
        {"attn_cp_rank": 1},
        {"attn_cp_size": 0},
        {"dcp_rank": 2, "dcp_size": 2, "logical_page_size": 4},
        {"dcp_size": 0},
        {"dcp_size": 2, "logical_page_size": 0},
        {"dcp_size": 2, "logical_page_size": True},
        {"tp_rank": False},
        {"pp_size": True},
        {"attn_cp_rank": 0.0},
        {"is_mla_model": 1},
        {"is_mla_model": None},
    ],
)
def test_shard_fields_out_of_range_are_typed_errors(fields: dict[str, Any]) -> None:
    store = RecordingStore()
    with pytest.raises(PageStoreArgumentError):
        SGLangPageStorage(config(**fields), {}, store=store)  # type: ignore[arg-type]
    with pytest.raises(PageStoreArgumentError):
        shard_key_parts(config(**fields))
    assert store.calls == [] and store.registered == []


def test_logical_page_size_is_read_only_with_dcp() -> None:
    cfg = config()
    del cfg.logical_page_size  # without DCP it is not needed
    assert shard_key_parts(cfg) == []
    cfg = config(dcp_size=2)
    del cfg.logical_page_size
    with pytest.raises(PageStoreArgumentError, match="logical_page_size"):
        shard_key_parts(cfg)


# ------------------------------------------------------- the wrapper's sizes
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize(
    "options",
    [
        {"dtype": torch.bfloat16},
        {"dtype": torch.float8_e4m3fn},
        {"dtype": torch.float32},
        {"dtype": torch.uint8, "kv_cache_dim": 40},  # a packed row, wider than 16 + 8
    ],
)
def test_size_members_are_sglangs(layout: str, options: dict[str, Any]) -> None:
    pool = host(layout, **options)
    w = wrap_host_pool(pool)
    item = torch.empty((), dtype=options["dtype"]).element_size()
    dim = options.get("kv_cache_dim", 24)
    assert (w.layout, w.size, w.page_size, w.layer_num) == (layout, pool.size, PS, 3)
    assert w.page_num == pool.size // PS
    assert (w.start_layer, w.end_layer) == (0, 2)
    assert w.dtype == options["dtype"]
    assert (w.kv_lora_rank, w.qk_rope_head_dim, w.kv_cache_dim) == (16, 8, dim)
    assert w.token_stride_size == dim * item
    assert w.layout_dim == w.size_per_token == dim * item * 3
    assert w.get_size_per_token() == w.get_ksize_per_token() == dim * item * 3
    assert (w.logical_size, w.logical_page_size) == (pool.size, PS)
    # SGLang's storage backends size a page as size_per_token * page_size
    page = pool.get_dummy_flat_data_page()
    assert w.size_per_token * w.page_size == page.numel() * page.element_size()
    assert w.pin_memory is bool(pool.pin_memory) and w.device == "cpu"
    assert w.kv_buffer is getattr(pool, "kv_buffer", None)
    assert w.storage_format_tag is None  # SGLang's own byte order: pages shared
    assert w.pool is pool
    assert (w.dcp_size, w.dcp_rank) == (1, 0)


def test_the_wrapper_refuses_what_is_not_our_host_pool() -> None:
    for bad in (object(), wrap_host_pool(host()), None):
        with pytest.raises(ArgumentTypeError, match="MLAHostPoolBase"):
            SGLangHostPool(bad)  # type: ignore[arg-type]


def test_a_config_without_a_model_name_keys_under_dash() -> None:
    cfg = config()
    del cfg.model_name
    assert keys_asked(cfg, ["h"]) == ["h@-@page_first"]


def test_page_num_is_an_int_and_pin_memory_the_pools() -> None:
    pool = host("page_first")
    w = wrap_host_pool(pool)
    assert type(w.page_num) is int and w.page_num == pool.size // PS == 8
    pool.pin_memory = True  # what the pool reports, not a default
    assert wrap_host_pool(pool).pin_memory is True


@pytest.mark.parametrize(("layout", "tag"), [("page_first_kv_split", "sgl-page_first_kv_split"),
                                             ("page_head", "sgl-page_head")])  # fmt: skip
def test_layouts_with_other_page_bytes_carry_a_storage_format_tag(layout: str, tag: str) -> None:
    """Only the Ascend backend builds such MLA layouts; a torch pool reporting one stands in."""
    pool = host("page_first")
    pool.__class__ = type("OtherBytes", (type(pool),), {"layout": property(lambda self: layout)})
    w = wrap_host_pool(pool)
    assert (w.layout, w.storage_format_tag) == (layout, tag)


def test_a_pool_without_one_kv_buffer_reports_none() -> None:
    """Split layouts (Ascend's page_first_kv_split) have no kv_buffer; SGLang reads None."""
    pool = host("page_first")
    del pool.kv_buffer
    assert wrap_host_pool(pool).kv_buffer is None


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({}, "rank"),
        ({"is_mla_model": True}, "rank"),
        ({"is_mla_model": True, "tp_rank": 1, "tp_size": 2}, "tp1of2"),
        ({"is_mla_model": False, "tp_rank": 1, "tp_size": 2}, "tp1of2"),
        (
            {"is_mla_model": True, "tp_rank": 1, "tp_size": 2, "pp_rank": 1, "pp_size": 2},
            "tp1of2-pp1of2",
        ),
        ({"dp_rank": 3}, "dp3"),
        ({"dp_rank": 0}, "rank"),
        ({"dp_rank": True}, "rank"),  # a flag is not a DP rank
        ({"dp_rank": "3"}, "rank"),  # nor is a string
        ({"is_mla_model": True, "tp_rank": 0, "tp_size": 2, "dp_rank": 1}, "tp0of2-dp1"),
    ],
)
def test_rank_root_name_of_each_rank(fields: dict[str, Any], name: str) -> None:
    assert rank_root_name(config(**fields)) == name


@pytest.mark.parametrize("mla", [False, True])
def test_every_rank_of_a_server_gets_its_own_root(mla: bool) -> None:
    """Distinct (TP, PP, DP) ranks never share a bounded directory (it is flocked)."""
    names = [
        rank_root_name(
            config(is_mla_model=mla, tp_rank=t, tp_size=2, pp_rank=p, pp_size=2, dp_rank=d)
        )
        for t in range(2)
        for p in range(2)
        for d in range(3)
    ]
    assert len(set(names)) == len(names) == 12


def test_the_default_pool_label_is_sglangs_kv_entry() -> None:
    assert wrap_host_pool(host()).pool_label == "kv"  # SGLang's PoolName.KV
    assert wrap_host_pool(host(), pool_label="draft").pool_label == "draft"


def test_a_host_pool_with_an_indexer_is_refused() -> None:
    """SGLang keeps DeepSeek-V3.2's indexer as its own INDEXER entry: a folded one is refused."""
    backend = sgl_core.get_backend("torch")
    packed: dict[str, Any] = {
        "size": 4 * PS,
        "page_size": PS,
        "dtype": torch.uint8,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "kv_cache_dim": 656,
        "layer_num": 2,
    }
    dev = backend.create_device_pool(
        **packed, index_head_dim=16, indexer_layer_ids=[1], with_index_k_scale=True
    )
    with pytest.raises(ArgumentTypeError, match="indexer"):
        wrap_host_pool(backend.create_host_pool(dev, layout="page_first"))
    plain = backend.create_device_pool(**packed)
    wrap_host_pool(backend.create_host_pool(plain, layout="page_first"))  # no indexer: taken
