"""Boundary tests of L3 page keys, page resolution and the file store's accounting (issue #18)."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from _l3_helpers import PAGE, filled_host, make_host, page_bytes, tokens

from sgl_core.l3 import FilePageStore, PageStoreArgumentError, PageStoreNotReadyError, page_keys
from sgl_core.l3._format import page_format
from sgl_core.l3._pages import check_keys, resolve_pages


# ------------------------------------------------------------------ page keys
def reference_keys(tokens_: list[int], page_size: int, prior: str = "", ns: str = "") -> list[str]:
    """The documented chain, computed independently of ``page_keys``."""
    keys, prev = [], prior
    for p in range(len(tokens_) // page_size):
        page = tokens_[p * page_size : (p + 1) * page_size]
        body = prev.encode() + b"\x00" + struct.pack(f"<{page_size}q", *page)
        prev = ns + hashlib.sha256(body).hexdigest()
        keys.append(prev)
    return keys


def test_page_keys_match_the_documented_chain() -> None:
    toks = list(range(-3, 3 * 4 - 1))  # negative ids too; a trailing partial page of 2
    assert page_keys(toks, 4) == reference_keys(toks, 4)
    assert len(page_keys(toks, 4)) == 3
    assert page_keys(toks[:3], 4) == []
    assert page_keys(toks, 1) == reference_keys(toks, 1)
    assert page_keys(torch.tensor(toks), 4) == page_keys(toks, 4)
    assert page_keys(toks, 4, prior_key="") == page_keys(toks, 4)
    big = [2**63 - 1, -(2**63), 0, 1]
    assert page_keys(big, 4) == reference_keys(big, 4)


def test_page_key_chain_continues_under_a_namespace() -> None:
    toks = list(range(5 * 4))
    whole = page_keys(toks, 4, namespace="model-a/")
    assert whole == reference_keys(toks, 4, ns="model-a/")
    assert all(k.startswith("model-a/") for k in whole)
    head = page_keys(toks[:8], 4, namespace="model-a/")
    tail = page_keys(toks[8:], 4, prior_key=head[-1], namespace="model-a/")
    assert head + tail == whole
    plain = page_keys(toks, 4)
    assert not set(plain) & set(whole)
    # a prior key of another namespace chains to other keys
    other = page_keys(toks[8:], 4, prior_key=page_keys(toks[:8], 4)[-1], namespace="model-a/")
    assert other != tail


@pytest.mark.parametrize(
    "kwargs",
    [
        {"page_size": 0},
        {"page_size": -4},
        {"page_size": True},
        {"page_size": 4.0},
        {"page_size": 4, "scheme": "md5"},
        {"page_size": 4, "prior_key": b"abc"},
        {"page_size": 4, "prior_key": 7},
    ],
)
def test_page_keys_rejects_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        page_keys(list(range(8)), **kwargs)


# ------------------------------------------------------------------ check_keys
def test_check_keys_edges() -> None:
    assert check_keys(["b", "a", "c"]) == ["b", "a", "c"]
    assert check_keys(k for k in ("x", "y")) == ["x", "y"]
    assert check_keys([]) == []
    for bad in ("abc", b"abc", 5, None, ["a", ""], ["a", 1], ["a", None], ["\ud800"]):
        with pytest.raises(PageStoreArgumentError):
            check_keys(bad)  # type: ignore[arg-type]
    with pytest.raises(PageStoreArgumentError, match=r"duplicates, e\.g\. 'b'"):
        check_keys(["a", "b", "c", "b"])


# --------------------------------------------------------------- resolve_pages
def test_resolve_pages_pairs_each_key_with_its_page() -> None:
    host = make_host("page_first")
    fmt = page_format(host)
    idx = tokens(3, 1).tolist() + tokens(0, 1).tolist() + tokens(7, 1).tolist()
    pages = resolve_pages(host, fmt, ["k3", "k0", "k7"], idx)
    assert [p.key for p in pages] == ["k3", "k0", "k7"]
    assert [p.start for p in pages] == [3 * PAGE, 0, 7 * PAGE]
    ptrs, sizes = host.get_page_buffer_meta(tokens(3, 1))
    assert pages[0].ptrs == tuple(ptrs) and pages[0].sizes == tuple(sizes)
    assert pages[0].nbytes == fmt.page_bytes
    assert all(p.sizes == fmt.object_bytes for p in pages)
    assert resolve_pages(host, fmt, [], []) == []


def test_resolve_pages_rejects_before_anything_moves() -> None:
    host = make_host("page_first")
    fmt = page_format(host)
    last = host.size // PAGE - 1
    two = tokens(0, 2).tolist()
    cases: list[tuple[list[str], object]] = [
        (["a", "b"], tokens(0, 1).tolist()),  # too few indices
        (["a"], two),  # too many
        (["a", "b"], tokens(1, 1).tolist() * 2),  # two keys, one host page
        (["a", "b"], tokens(last, 1).tolist() + tokens(last + 1, 1).tolist()),  # past the end
        (["a"], [i + 1 for i in range(PAGE)]),  # not page aligned
        (["a"], [-1, *range(1, PAGE)]),
        (["a"], [float(i) for i in range(PAGE)]),
        (["a", "a"], two),
    ]
    for keys, idx in cases:
        with pytest.raises(PageStoreArgumentError):
            resolve_pages(host, fmt, keys, idx)
    with pytest.raises(PageStoreNotReadyError):
        resolve_pages(None, fmt, ["a"], tokens(0, 1))
    with pytest.raises(PageStoreNotReadyError):
        resolve_pages(host, None, ["a"], tokens(0, 1))


class LyingHost:
    """A host pool whose page meta disagrees with its format."""

    def __init__(self, host: Any, extra: bool = False, sizes_off: int = 0) -> None:
        self.host, self.extra, self.sizes_off = host, extra, sizes_off
        self.size = host.size

    def get_page_buffer_meta(self, idx: Any) -> tuple[list[int], list[int]]:
        ptrs, sizes = self.host.get_page_buffer_meta(idx)
        if self.extra:
            return [*ptrs, ptrs[0]], [*sizes, sizes[0]]
        return ptrs, [sizes[0] + self.sizes_off, *sizes[1:]]


def test_resolve_pages_checks_the_host_page_meta() -> None:
    host = make_host("page_first")
    fmt = page_format(host)
    for lying in (LyingHost(host, extra=True), LyingHost(host, sizes_off=8)):
        with pytest.raises(PageStoreArgumentError, match="registered page format"):
            resolve_pages(lying, fmt, ["a"], tokens(1, 1))  # type: ignore[arg-type]


# --------------------------------------------------- file store byte accounting
def store_with_pages(root: Path, capacity: int | None = None) -> tuple[FilePageStore, list[str]]:
    host, _ = filled_host("page_first", seed=5)
    store = FilePageStore(root, capacity)
    store.register_host_pool(host)
    keys = page_keys(list(range(3 * PAGE)), PAGE)
    return store, keys


def file_size(store: FilePageStore, key: str) -> int:
    return store._path(key).stat().st_size


def test_corrupt_page_drop_keeps_byte_accounting_exact(tmp_path: Path) -> None:
    store, keys = store_with_pages(tmp_path)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    per_page = file_size(store, keys[0])
    assert store.stats().stored_bytes == 3 * per_page
    path = store._path(keys[1])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    dst = make_host("page_first")
    store.register_host_pool(dst)
    assert store.batch_get(keys, tokens(0, 3)) == [True, False, True]
    stats = store.stats()
    assert stats.stored_pages == 2 and stats.stored_bytes == 2 * per_page
    assert stats.errors["corrupt"] == 1


def test_drop_corrupt_spares_a_file_replaced_meanwhile(tmp_path: Path) -> None:
    store, keys = store_with_pages(tmp_path)
    store.batch_set(keys, tokens(2, 3))
    per_page = file_size(store, keys[0])
    fmt = page_format(store._snapshot()[0])  # type: ignore[arg-type]
    name = store._name(fmt, keys[0])
    other = store._path(keys[1]).stat()  # the stat of another file
    store._drop_corrupt(keys[0], name, other, "test")
    assert store._path(keys[0]).exists()
    assert store.stats().stored_bytes == 3 * per_page
    assert store.stats().errors["corrupt"] == 1
    store._drop_corrupt(keys[0], name, store._path(keys[0]).stat(), "test")
    assert not store._path(keys[0]).exists()
    assert store.stats().stored_bytes == 2 * per_page and store.stats().stored_pages == 2
    store._drop_corrupt(keys[0], name, other, "gone already")  # no file: nothing to drop
    assert store.stats().stored_bytes == 2 * per_page and store.stats().errors["corrupt"] == 3


def test_capacity_is_a_ceiling_not_a_strict_bound(tmp_path: Path) -> None:
    probe, keys = store_with_pages(tmp_path / "probe")
    probe.batch_set(keys[:1], tokens(2, 1))
    per_page = file_size(probe, keys[0])
    store, keys = store_with_pages(tmp_path / "l3", capacity=2 * per_page)
    assert store.batch_set(keys[:2], tokens(2, 2)) == [True, True]
    assert store.stats().evicted_pages == 0  # exactly full is allowed
    assert store.stats().stored_bytes == 2 * per_page
    assert store.batch_set(keys[2:], tokens(4, 1)) == [True]
    stats = store.stats()
    assert stats.evicted_pages == 1 and stats.stored_pages == 2
    assert stats.stored_bytes == 2 * per_page
    assert store.batch_exists(keys[:1]) == 0 and store.batch_exists(keys[1:]) == 2
    # a page of exactly the capacity fits alone; one byte less does not
    alone, _ = store_with_pages(tmp_path / "one", capacity=per_page)
    assert alone.batch_set(keys[:1], tokens(2, 1)) == [True]
    assert alone.batch_set(keys[1:2], tokens(3, 1)) == [True]
    assert alone.stats().stored_pages == 1 and alone.stats().evicted_pages == 1
    tight, _ = store_with_pages(tmp_path / "tight", capacity=per_page - 1)
    assert tight.batch_set(keys[:1], tokens(2, 1)) == [False]
    assert tight.stats().stored_bytes == 0


def test_make_room_evicts_least_recent_first_and_never_the_protected(tmp_path: Path) -> None:
    store, keys = store_with_pages(tmp_path)
    store.batch_set(keys, tokens(2, 3))
    per_page = file_size(store, keys[0])
    fmt = page_format(store._snapshot()[0])  # type: ignore[arg-type]
    names = [store._name(fmt, k) for k in keys]
    assert store._make_room(10**9, protect=names[0])  # no capacity: always room
    store._capacity = 3 * per_page
    with store._lock:
        assert not store._make_room(3 * per_page + 1, protect=names[0])  # never fits
        assert store.stats().stored_pages == 3  # ... and nothing was evicted for it
        assert store._make_room(per_page, protect=names[0])
        assert list(store._lru) == names[1:] or list(store._lru) == [names[0], *names[2:]]
        assert names[0] in store._lru and store.stats().stored_pages == 2
        # only the protected page and the next one left; making room for two pages
        # must evict the other one and then fail
        assert not store._make_room(2 * per_page + 1, protect=names[0])
        assert list(store._lru) == [names[0]]
    assert store.stats().evicted_pages == 2
    assert store.stats().stored_bytes == per_page
    assert os.path.exists(store._path(keys[0]))


def test_loaded_bytes_are_the_stored_ones(tmp_path: Path) -> None:
    store, keys = store_with_pages(tmp_path)
    src, _ = store._snapshot()
    store.batch_set(keys, tokens(2, 3))
    dst = make_host("page_first")
    store.register_host_pool(dst)
    assert store.batch_get(keys[::-1], tokens(4, 3)) == [True] * 3
    for i in range(3):
        assert torch.equal(page_bytes(dst, (4 + 2 - i) * PAGE), page_bytes(src, (2 + i) * PAGE))


def test_resolve_pages_errors_name_host_indices() -> None:
    host = make_host("page_first")
    fmt = page_format(host)
    past = list(range(host.size, host.size + PAGE))
    with pytest.raises(PageStoreArgumentError, match=r"^host_indices holds"):
        resolve_pages(host, fmt, ["a"], past)


def test_drop_of_a_page_this_store_never_indexed(tmp_path: Path) -> None:
    """Another store wrote the page after this one opened; it is corrupt: a miss, no error."""
    reader, keys = store_with_pages(tmp_path)
    writer, _ = store_with_pages(tmp_path)
    assert writer.batch_set(keys, tokens(2, 3)) == [True] * 3
    path = writer._path(keys[0])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    reader.register_host_pool(make_host("page_first"))
    assert reader.batch_get(keys[:1], tokens(0, 1)) == [False]
    assert not path.exists() and reader.stats().errors["corrupt"] == 1
    # a page whose file is already gone is forgotten without an error
    fmt = page_format(reader._snapshot()[0])  # type: ignore[arg-type]
    reader.batch_get(keys[1:2], tokens(1, 1))  # adopted: now in this store's index
    name = reader._name(fmt, keys[1])
    reader._path(keys[1]).unlink()
    with reader._lock:
        reader._drop(name)
    assert name not in reader._lru


def test_room_is_made_after_a_foreign_writer_finished(tmp_path: Path) -> None:
    """A live writer's temp file counts until it is gone; then no page is evicted for it."""
    import fcntl

    probe, keys = store_with_pages(tmp_path / "probe")
    probe.batch_set(keys[:1], tokens(2, 1))
    per_page = file_size(probe, keys[0])
    root = tmp_path / "l3"
    (root / "tmp").mkdir(parents=True)
    foreign = root / "tmp" / f"other.{os.getpid()}.x.tmp"
    foreign.write_bytes(b"\0" * per_page)
    fd = os.open(foreign, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live writer holds it
    try:
        store, keys = store_with_pages(root, capacity=2 * per_page)
        assert store.stats().stored_bytes == per_page  # counted
        assert store.batch_set(keys[:1], tokens(2, 1)) == [True]
    finally:
        os.close(fd)  # the writer finishes and removes its file
    foreign.unlink()
    assert store.batch_set(keys[1:2], tokens(3, 1)) == [True]
    assert store.stats().evicted_pages == 0 and store.stats().stored_pages == 2


def sglang_reference(tokens_: list[int], page_size: int, prior: str | None = None) -> list[str]:
    """SGLang 0.5.23's page hashes as ``page_keys`` documents them, computed independently."""
    keys, prev = [], bytes.fromhex(prior) if prior else b""
    for p in range(len(tokens_) // page_size):
        page = tokens_[p * page_size : (p + 1) * page_size]
        if max(page) > 2**32 - 1:
            body = b"\xff" + struct.pack(f"<{page_size}Q", *page)
        else:
            body = struct.pack(f"<{page_size}I", *page)
        prev = hashlib.sha256(prev + body).digest()
        keys.append(prev.hex())
    return keys


def test_sglang_scheme_keys_and_chain() -> None:
    toks = [5, 2**32, 7, 1, 9, 9, 0, 3, 4]  # a wide page, a narrow one, a partial one
    keys = page_keys(toks, 4, scheme="sglang")
    assert keys == sglang_reference(toks, 4) and len(keys) == 2
    tail = page_keys(toks[4:], 4, prior_key=keys[0], scheme="sglang")
    assert tail == keys[1:] == sglang_reference(toks[4:], 4, keys[0])
    assert page_keys(toks, 2, scheme="sglang") == sglang_reference(toks, 2)
    for kwargs in (
        {"namespace": "m/"},
        {"prior_key": "xyz"},
        {"prior_key": "ab" * 31},
    ):
        with pytest.raises(ValueError):
            page_keys(toks, 4, scheme="sglang", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative"):
        page_keys([-1, 0, 1, 2], 4, scheme="sglang")


def test_resolve_pages_check_messages_name_host_indices() -> None:
    host = make_host("page_first")
    fmt = page_format(host)
    with pytest.raises(PageStoreArgumentError, match=r"^host_indices must be whole pages"):
        resolve_pages(host, fmt, ["a"], [i + 1 for i in range(PAGE)])
    with pytest.raises(PageStoreArgumentError, match=r"^host_indices contains duplicate"):
        resolve_pages(host, fmt, ["a", "b"], tokens(1, 1).tolist() * 2)
