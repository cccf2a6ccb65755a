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
from sgl_core.integrations.sglang_storage import SGLangPageStorage
from sgl_core.l3 import PageStoreArgumentError, page_keys


def _config(model: str, **extra: Any) -> Any:
    return types.SimpleNamespace(
        model_name=model, is_mla_model=True, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
        extra_config=extra,
    )  # fmt: skip


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
