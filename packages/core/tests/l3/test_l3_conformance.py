"""Behaviour every PageStore keeps; runs against FilePageStore and MooncakePageStore."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _l3_helpers import (
    LAYOUTS,
    PAGE,
    TORCH_LAYOUTS,
    device_matches,
    fill_sentinel,
    filled_host,
    make_host,
    page_bytes,
    tokens,
)

from sgl_core.l3 import (
    PageStore,
    PageStoreArgumentError,
    PageStoreNotReadyError,
    page_keys,
)
from sgl_core.l3._mooncake_store import mooncake_key

StoreFactory = Callable[[], Any]


def _drop_last_object(store: Any, key: str, last_object_bytes: int) -> None:
    """Damage a stored page behind the store's back: lose its last object.

    A file page is truncated by the last object's bytes; a Mooncake page (one
    object per page) is removed.
    """
    if hasattr(store, "_path"):
        path = store._path(key)
        data = path.read_bytes()
        path.write_bytes(data[:-last_object_bytes])
    else:
        assert store._client.remove(mooncake_key(key, store.page_format), True) == 0


def test_is_a_page_store(make_store: StoreFactory) -> None:
    assert isinstance(make_store(), PageStore)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_to_another_host_pool_and_device(
    make_store: StoreFactory, layout: str, ns: str
) -> None:
    src, dev = filled_host(layout, seed=11)
    keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(src)
    assert store.batch_exists(keys) == 0
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    assert store.batch_exists(keys) == 3

    dst = make_host(layout)
    reader = make_store()
    reader.register_host_pool(dst)
    assert reader.batch_exists(keys) == 3
    assert reader.batch_get(keys, tokens(5, 3)) == [True] * 3
    for i in range(3):
        assert torch.equal(page_bytes(dst, (5 + i) * PAGE), page_bytes(src, (2 + i) * PAGE))
    if layout in TORCH_LAYOUTS:
        assert device_matches(dst, 5, dev)
    stats = reader.stats()
    assert stats.pages_get >= 3
    assert stats.bytes_get >= 3 * page_bytes(src, 0).numel() * 2


def test_exists_counts_the_prefix_only(make_store: StoreFactory, ns: str) -> None:
    host, _ = filled_host("page_first", seed=3)
    keys = page_keys(list(range(4 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(host)
    # Pages 0, 1 and 3 stored; 2 missing: the prefix is 2 pages.
    assert store.batch_set([keys[0], keys[1], keys[3]], tokens(2, 3)) == [True] * 3
    assert store.batch_exists(keys) == 2
    assert store.batch_exists(keys[3:]) == 1
    assert store.batch_exists(keys[2:]) == 0
    assert store.batch_exists([]) == 0
    assert store.batch_exists([f"{ns}never-stored"]) == 0


def test_missing_page_is_false_and_leaves_host_untouched(make_store: StoreFactory, ns: str) -> None:
    src, _ = filled_host("layer_first", seed=5)
    keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(src)
    assert store.batch_set([keys[0], keys[2]], tokens(2, 2)) == [True, True]

    dst = make_host("layer_first")
    store.register_host_pool(dst)
    fill_sentinel(dst, 4, 3)
    before = page_bytes(dst, 5 * PAGE)
    assert store.batch_get(keys, tokens(4, 3)) == [True, False, True]
    assert torch.equal(page_bytes(dst, 5 * PAGE), before)
    assert torch.equal(page_bytes(dst, 4 * PAGE), page_bytes(src, 2 * PAGE))
    assert torch.equal(page_bytes(dst, 6 * PAGE), page_bytes(src, 3 * PAGE))
    assert store.stats().pages_get_failed >= 1


@pytest.mark.parametrize("layout", ["layer_first", "split"])
def test_partial_page_is_a_miss_and_never_written(
    make_store: StoreFactory, layout: str, ns: str
) -> None:
    src, _ = filled_host(layout, seed=8)
    keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(src)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    _, sizes = src.get_page_buffer_meta(tokens(0, 1))
    assert len(sizes) > 1
    _drop_last_object(store, keys[1], sizes[-1])  # the last object of page 1 only

    assert store.batch_exists(keys) == 1
    dst = make_host(layout)
    store.register_host_pool(dst)
    fill_sentinel(dst, 0, 3)
    before = page_bytes(dst, 1 * PAGE)
    assert store.batch_get(keys, tokens(0, 3)) == [True, False, True]
    assert torch.equal(page_bytes(dst, 1 * PAGE), before)

    # Setting the page again stores it whole (whole pages are skipped).
    store.register_host_pool(src)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    assert store.batch_exists(keys) == 3


def test_set_twice_skips_stored_pages(make_store: StoreFactory, ns: str) -> None:
    host, _ = filled_host("page_first_direct", seed=9)
    keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(host)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    skipped = store.stats().pages_skipped
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    assert store.stats().pages_skipped == skipped + 3


def test_clear_removes_everything(make_store: StoreFactory, ns: str) -> None:
    host, _ = filled_host("page_first", seed=1)
    keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(host)
    store.batch_set(keys, tokens(2, 3))
    store.clear()
    assert store.batch_exists(keys) == 0
    assert store.batch_get(keys, tokens(2, 3)) == [False] * 3


def test_namespaces_do_not_mix(make_store: StoreFactory, ns: str) -> None:
    host, _ = filled_host("page_first", seed=2)
    toks = list(range(2 * PAGE))
    store = make_store()
    store.register_host_pool(host)
    store.batch_set(page_keys(toks, PAGE, namespace=ns + "a/"), tokens(2, 2))
    assert store.batch_exists(page_keys(toks, PAGE, namespace=ns + "b/")) == 0
    assert store.batch_exists(page_keys(toks, PAGE, namespace=ns + "a/")) == 2


def test_misuse_raises(make_store: StoreFactory, ns: str) -> None:
    store = make_store()
    keys = page_keys(list(range(2 * PAGE)), PAGE, namespace=ns)
    if not hasattr(store, "_path"):
        pass  # the session's Mooncake client may already hold a pool
    else:
        with pytest.raises(PageStoreNotReadyError):
            store.batch_get(keys, tokens(0, 2))
    host, _ = filled_host("page_first", seed=4)
    store.register_host_pool(host)
    with pytest.raises(PageStoreArgumentError, match="host_indices"):
        store.batch_set(keys, tokens(0, 1))
    with pytest.raises(PageStoreArgumentError, match="duplicates"):
        store.batch_set([keys[0], keys[0]], tokens(0, 2))
    with pytest.raises(PageStoreArgumentError):
        store.batch_get(keys, torch.arange(1, 2 * PAGE + 1))  # not page aligned
    with pytest.raises(ValueError, match="host_indices"):
        store.batch_get(keys, tokens(0, 3))
    assert store.batch_set([], []) == []
    assert store.batch_get([], []) == []
