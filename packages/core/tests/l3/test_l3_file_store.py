"""FilePageStore specifics: corruption, eviction, persistence, threads."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from _l3_helpers import PAGE, fill_sentinel, filled_host, make_host, page_bytes, tokens

from sgl_core.l3 import FilePageStore, PageStoreArgumentError, page_keys


def _store(
    tmp_path: Path, layout: str = "page_first", capacity_bytes: int | None = None
) -> tuple[FilePageStore, Any]:
    host, _ = filled_host(layout, seed=21)
    store = FilePageStore(tmp_path / "l3", capacity_bytes)
    store.register_host_pool(host)
    return store, host


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap"])
def test_corruption_is_a_logged_miss(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, host = _store(tmp_path)
    keys = page_keys(list(range(3 * PAGE)), PAGE)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    path = store._path(keys[1])
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-5] ^= 0x40
    elif damage == "truncate":
        data = data[:-3]
    else:  # another page's (valid) object under this name
        data = bytearray(store._path(keys[2]).read_bytes())
    path.write_bytes(bytes(data))

    dst = make_host("page_first")
    store.register_host_pool(dst)
    fill_sentinel(dst, 0, 3)
    before = page_bytes(dst, PAGE)
    with caplog.at_level(logging.WARNING, logger="sgl_core.l3"):
        assert store.batch_get(keys, tokens(0, 3)) == [True, False, True]
    assert "corrupt" in caplog.text
    assert torch.equal(page_bytes(dst, PAGE), before)
    assert store.stats().errors["corrupt"] == 1
    assert not path.exists()  # dropped, so it can be stored again
    assert store.batch_exists(keys) == 1
    store.register_host_pool(host)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    assert store.batch_exists(keys) == 3


def _page_file_bytes(tmp_path: Path, layout: str = "page_first") -> int:
    store, _ = _store(tmp_path / f"probe-{layout}", layout)
    store.batch_set(page_keys(list(range(PAGE)), PAGE), tokens(2, 1))
    size = store.stats().stored_bytes
    assert size is not None
    return size


def test_lru_eviction_of_whole_pages(tmp_path: Path) -> None:
    per_page = _page_file_bytes(tmp_path, "layer_first")
    store, _ = _store(tmp_path, "layer_first", capacity_bytes=3 * per_page + 10)
    keys = [page_keys([i] * PAGE, PAGE)[0] for i in range(5)]
    for i in range(3):
        assert store.batch_set([keys[i]], tokens(2 + i, 1)) == [True]
    # Touch page 0 so page 1 is the least recently used.
    dst = make_host("layer_first")
    store.register_host_pool(dst)
    assert store.batch_get([keys[0]], tokens(0, 1)) == [True]
    store.register_host_pool(_store(tmp_path / "src2", "layer_first")[1])
    assert store.batch_set([keys[3]], tokens(2, 1)) == [True]
    assert store.stats().evicted_pages == 1
    present = [store.batch_exists([k]) for k in keys[:4]]
    assert present == [1, 0, 1, 1]
    stats = store.stats()
    assert stats.stored_pages == 3
    assert stats.stored_bytes is not None
    assert store.capacity_bytes is not None
    assert stats.stored_bytes <= store.capacity_bytes


def test_page_larger_than_capacity_fails(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, capacity_bytes=100)
    assert store.batch_set(page_keys(list(range(PAGE)), PAGE), tokens(2, 1)) == [False]
    assert store.stats().errors["no_space"] == 1


def test_reopened_store_sees_pages_and_capacity(tmp_path: Path) -> None:
    per_page = _page_file_bytes(tmp_path)
    store, host = _store(tmp_path)
    keys = page_keys(list(range(3 * PAGE)), PAGE)
    store.batch_set(keys, tokens(2, 3))
    store.close()  # a bounded store needs the root alone
    again = FilePageStore(tmp_path / "l3", capacity_bytes=2 * per_page + 1)
    assert again.stats().stored_pages == 3
    again.register_host_pool(host)
    assert again.batch_exists(keys) == 3
    # Writing one more page evicts the oldest two found on disk.
    assert again.batch_set(page_keys([5] * PAGE, PAGE), tokens(2, 1)) == [True]
    assert again.stats().stored_pages == 2


def test_bad_capacity(tmp_path: Path) -> None:
    with pytest.raises(PageStoreArgumentError, match="capacity_bytes"):
        FilePageStore(tmp_path, capacity_bytes=0)


def test_concurrent_threads(tmp_path: Path) -> None:
    per_page = _page_file_bytes(tmp_path)
    store, src = _store(tmp_path, capacity_bytes=6 * per_page)
    errors: list[BaseException] = []
    dst = make_host("page_first")

    def work(t: int) -> None:
        try:
            for r in range(15):
                keys = page_keys([t, r % 5] * (PAGE // 2) * 3, PAGE)
                ok = store.batch_set(keys, tokens(2, 3))
                assert ok == [True] * 3
                got = store.batch_get(keys, tokens(5, 3))
                # Another thread may evict between set and get: misses are fine, garbage is not.
                for i, hit in enumerate(got):
                    if hit:
                        expect = page_bytes(src, (2 + i) * PAGE)
                        assert torch.equal(page_bytes(dst, (5 + i) * PAGE), expect)
        except BaseException as exc:
            errors.append(exc)

    # All threads read into the same host pages with the same bytes, so checks stay valid.
    store.register_host_pool(src)
    dst = src
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    stats = store.stats()
    assert stats.stored_bytes is not None
    assert stats.stored_bytes <= 6 * per_page
    assert not list((tmp_path / "l3" / "tmp").iterdir())
