"""The SGLang storage backend class over both L3 stores, without sglang installed.

SGLang itself drives it in tests/with_sglang; here the same class runs on the
file store and on a real Mooncake master (loopback), as SGLang would call it.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _l3_helpers import PAGE, filled_host, tokens

from sgl_core.integrations.sglang import wrap_host_pool
from sgl_core.integrations.sglang_storage import SGLangPageStorage, shard_key_parts
from sgl_core.l3 import FilePageStore, PageStoreArgumentError, page_keys

_ONE_RANK = dict(
    is_mla_model=True, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
    attn_cp_size=1, dcp_rank=0, dcp_size=1, logical_page_size=None,
)  # fmt: skip


def _config(model: str, **extra: Any) -> Any:
    return types.SimpleNamespace(model_name=model, extra_config=extra, **_ONE_RANK)


def _ranked(**fields: Any) -> Any:
    return types.SimpleNamespace(model_name="m", extra_config={}, **{**_ONE_RANK, **fields})


def test_backend_over_store(make_store: Callable[[], Any], ns: str) -> None:
    host, _ = filled_host("page_first", seed=21)
    wrapped = wrap_host_pool(host)
    backend = SGLangPageStorage(_config(ns + "m1"), {}, store=make_store())
    backend.register_mem_pool_host(wrapped)
    keys = page_keys(list(range(3 * PAGE)), PAGE, scheme="sglang")
    src = tokens(2, 3)
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, src) == [True] * 3
    assert backend.batch_exists(keys) == 3 and backend.exists(keys[2])

    dst = tokens(5, 3)
    assert backend.batch_get_v1(keys, dst) == [True] * 3
    for i in range(3):
        assert torch.equal(host.get_data_page((5 + i) * PAGE), host.get_data_page((2 + i) * PAGE))

    # Another model on the same store: its keys never meet these pages.
    other = SGLangPageStorage(_config(ns + "m2"), {}, store=backend.store)
    other.register_mem_pool_host(wrapped)
    assert other.batch_exists(keys) == 0
    assert other.batch_get_v1(keys[:1], tokens(0, 1)) == [False]


def test_backend_misuse(tmp_path: Any) -> None:
    with pytest.raises(PageStoreArgumentError):
        SGLangPageStorage(_config("m", store="file"))  # no path
    with pytest.raises(PageStoreArgumentError):
        SGLangPageStorage(_config("m", store="s3", path=str(tmp_path)))
    with pytest.raises(PageStoreArgumentError):
        SGLangPageStorage(_config("m", store="mooncake", mooncake={"no_such_field": 1}))
    with pytest.raises(PageStoreArgumentError):
        SGLangPageStorage(_config("m", store="mooncake", mooncake=["not", "a", "mapping"]))
    bad_extra = types.SimpleNamespace(model_name="m", extra_config=["store", "file"])
    with pytest.raises(PageStoreArgumentError):
        SGLangPageStorage(bad_extra)
    backend = SGLangPageStorage(_config("m", store="file", path=str(tmp_path)))
    host, _ = filled_host("layer_first", seed=22)
    with pytest.raises(PageStoreArgumentError):
        backend.register_mem_pool_host(host)  # not wrapped
    with pytest.raises(PageStoreArgumentError):
        backend.get("k")  # no host pool yet
    backend.register_mem_pool_host(wrap_host_pool(host))
    with pytest.raises(PageStoreArgumentError):
        backend.batch_exists("abc")
    with pytest.raises(PageStoreArgumentError):
        backend.set("k", value=None)
    with pytest.raises(PageStoreArgumentError):
        backend.batch_set(["k"])
    assert backend.batch_exists([]) == 0


# (writer's fields, reader's fields, whether the reader sees the writer's pages)
_SHARDS = [
    # MHA: heads are split over TP ranks, and a TP size splits them differently.
    (dict(is_mla_model=False, tp_size=2), dict(is_mla_model=False, tp_rank=1, tp_size=2), False),
    (dict(is_mla_model=False), dict(is_mla_model=False, tp_size=2), False),
    # MLA: every TP rank holds the same pages (SGLang shares them).
    (dict(tp_size=2), dict(tp_rank=1, tp_size=2), True),
    (dict(), dict(tp_rank=3, tp_size=4), True),
    # Pipeline stages hold other layers.
    (dict(pp_size=2), dict(pp_rank=1, pp_size=2), False),
    (dict(is_mla_model=False, pp_size=2), dict(is_mla_model=False, pp_rank=1, pp_size=2), False),
    (dict(), dict(pp_size=2), False),
    # Attention context parallel: each rank holds its own slice of every page.
    (dict(attn_cp_size=2), dict(attn_cp_rank=1, attn_cp_size=2), False),
    (dict(is_mla_model=False, attn_cp_size=2),
     dict(is_mla_model=False, attn_cp_rank=1, attn_cp_size=2), False),
    (dict(), dict(attn_cp_size=2), False),
    (dict(tp_size=2, attn_cp_size=2), dict(tp_rank=1, tp_size=2, attn_cp_size=2), True),
    (dict(is_mla_model=False, tp_size=2, pp_size=2, attn_cp_size=2),
     dict(is_mla_model=False, tp_size=2, pp_size=2, attn_cp_rank=1, attn_cp_size=2), False),
    # Decode context parallel (MLA): one shard per DCP rank, shared across DCP groups.
    (dict(tp_size=2, dcp_size=2, logical_page_size=8),
     dict(tp_rank=1, tp_size=2, dcp_rank=1, dcp_size=2, logical_page_size=8), False),
    (dict(tp_size=4, dcp_size=2, logical_page_size=8),
     dict(tp_rank=2, tp_size=4, dcp_size=2, logical_page_size=8), True),
    (dict(tp_size=4, dcp_size=2, logical_page_size=8),
     dict(tp_size=2, dcp_size=2, logical_page_size=8), False),
    (dict(tp_size=2, dcp_size=2, logical_page_size=8),
     dict(tp_size=2, dcp_size=2, logical_page_size=16), False),
    (dict(), dict(tp_size=2, dcp_size=2, logical_page_size=8), False),
]  # fmt: skip


@pytest.mark.parametrize(("writer", "reader", "shared"), _SHARDS)
def test_backend_keys_per_shard(
    tmp_path: Any, writer: dict[str, Any], reader: dict[str, Any], shared: bool
) -> None:
    host, _ = filled_host("page_first", seed=23)
    wrapped = wrap_host_pool(host)
    store = FilePageStore(str(tmp_path / "l3"))
    keys = page_keys(list(range(2 * PAGE)), PAGE, scheme="sglang")
    a = SGLangPageStorage(_ranked(**writer), {}, store=store)
    a.register_mem_pool_host(wrapped)
    assert a.batch_set_v1(keys, tokens(1, 2)) == [True, True]
    b = SGLangPageStorage(_ranked(**reader), {}, store=store)
    b.register_mem_pool_host(wrapped)
    before = host.get_data_page(4 * PAGE).clone()
    assert b.batch_exists(keys) == (2 if shared else 0)
    assert b.batch_get_v1(keys[:1], tokens(4, 1)) == [shared]
    if not shared:  # a miss moved nothing
        assert torch.equal(host.get_data_page(4 * PAGE), before)
    # The writer's own pages stay its hits.
    assert a.batch_exists(keys) == 2


@pytest.mark.parametrize(
    "fields",
    [
        dict(tp_rank=2, tp_size=2),
        dict(pp_rank=1),
        dict(attn_cp_rank=-1, attn_cp_size=2),
        dict(attn_cp_size=0),
        dict(dcp_rank=1),
        dict(tp_size=True),
        dict(pp_size=2.0),
        dict(is_mla_model=1),
        dict(dcp_size=2, tp_size=2, logical_page_size=None),
        dict(dcp_size=2, tp_size=2, logical_page_size=0),
    ],
)
def test_backend_rejects_bad_shard_fields(fields: dict[str, Any]) -> None:
    with pytest.raises(PageStoreArgumentError):
        SGLangPageStorage(_ranked(**fields), {}, store=types.SimpleNamespace())


@pytest.mark.parametrize(
    "missing", ["is_mla_model", "tp_rank", "tp_size", "pp_rank", "pp_size", "attn_cp_rank",
                "attn_cp_size", "dcp_rank", "dcp_size"],
)  # fmt: skip
def test_backend_refuses_config_without_shard_field(missing: str) -> None:
    """A field the key needs, missing: a typed error, never a key shared by guess."""
    config = _ranked()
    delattr(config, missing)
    with pytest.raises(PageStoreArgumentError, match=missing):
        SGLangPageStorage(config, {}, store=types.SimpleNamespace())


def test_shard_key_parts_scheme() -> None:
    """The key scheme itself: a part only where ranks' bytes differ."""
    assert shard_key_parts(_ranked()) == []
    assert shard_key_parts(_ranked(tp_rank=1, tp_size=2)) == []
    assert shard_key_parts(_ranked(is_mla_model=False)) == ["tp0of1"]
    assert shard_key_parts(
        _ranked(is_mla_model=False, tp_rank=1, tp_size=2, pp_rank=1, pp_size=3,
                attn_cp_rank=1, attn_cp_size=2)
    ) == ["tp1of2", "pp1of3", "cp1of2"]  # fmt: skip
    assert shard_key_parts(
        _ranked(tp_rank=3, tp_size=4, dcp_rank=1, dcp_size=2, logical_page_size=8)
    ) == ["dcp1of2tp4page8"]


def test_model_name_cannot_forge_a_shard(tmp_path: Any) -> None:
    """A model named like another model's shard suffix keys its own pages."""
    host, _ = filled_host("page_first", seed=24)
    wrapped = wrap_host_pool(host)
    store = FilePageStore(str(tmp_path / "l3"))
    keys = page_keys(list(range(PAGE)), PAGE, scheme="sglang")
    cp1 = SGLangPageStorage(_ranked(attn_cp_rank=1, attn_cp_size=2), {}, store=store)
    cp1.register_mem_pool_host(wrapped)
    assert cp1.batch_set_v1(keys, tokens(1, 1)) == [True]
    forged = types.SimpleNamespace(**{**vars(_ranked()), "model_name": "m@cp1of2"})
    other = SGLangPageStorage(forged, {}, store=store)
    other.register_mem_pool_host(wrapped)
    assert other.batch_exists(keys) == 0
