"""Fault and abuse tests of the L3 page stores: nothing wrong ever comes back.

An engine that gets a wrong cache hit produces wrong tokens silently, so
these tests attack the stores as an adversarial user would: pools of another
page format, concurrent writers of one key (threads and processes), writers
killed with SIGKILL mid-write, a ``mooncake_master`` on 127.0.0.1 restarted
under load, corrupted and foreign pages, and bad arguments. Every hit must be
exactly one committed write of the page; everything else is a miss, a
``False`` or a typed ``sgl_core.l3`` error.

Every loop here is bounded by a round count or a deadline.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _l3_helpers import (
    PAGE,
    SplitHostPool,
    fill_random,
    raw_page,
    round_keys,
    tokens,
    torch_host,
)
from _mooncake_cluster import MooncakeCluster

from sgl_core.errors import (
    DeviceError,
    DuplicateIndexError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    PageAlignmentError,
)
from sgl_core.l3 import (
    FilePageStore,
    MooncakeConfig,
    MooncakePageStore,
    PageStoreArgumentError,
    PageStoreRootError,
    page_format,
    page_keys,
)
from sgl_core.l3._mooncake_store import mooncake_key
from sgl_core.l3._record import HEADER_SIZE

HERE = Path(__file__).resolve().parent
StoreFactory = Callable[[], Any]


# ----------------------------------------------------------------- helpers
class _IndexedPool(SplitHostPool):
    """A split pool that also reports indexer parts and declared format fields."""

    def __init__(
        self,
        layer_ids: tuple[int, ...] = (0, 1),
        head_dim: int = 8,
        scale: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.indexer_layer_ids = layer_ids
        self.index_k_buffer = torch.zeros(8, len(layer_ids), PAGE, 1, head_dim)
        self.index_k_scale_buffer = torch.zeros(8, len(layer_ids), PAGE, 1, 1) if scale else None
        self._extra = extra or {}

    def page_format_fields(self) -> dict[str, Any]:
        return self._extra


# writer format, reader format: same page bytes and object count, different meaning
FORMAT_PAIRS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "layout_byte_order": (
        lambda: torch_host("page_first"),
        lambda: torch_host("page_first_direct"),
    ),
    "dtype_of_equal_width": (
        lambda: torch_host("page_first"),
        lambda: torch_host("page_first", dtype=torch.float16),
    ),
    "kv_dims_same_row": (
        lambda: torch_host("page_first"),
        lambda: torch_host("page_first", kv_lora=48, rope=32),
    ),
    "layer_count": (
        lambda: torch_host("page_first"),
        lambda: torch_host("page_first", layers=2, kv_lora=128, rope=32),
    ),
    "indexer_layers": (lambda: _IndexedPool((0, 1)), lambda: _IndexedPool((2, 3))),
    "declared_fields": (
        lambda: _IndexedPool(extra={"kv_heads": 8}),
        lambda: _IndexedPool(extra={"kv_heads": 4}),
    ),
}


def _fill(host: Any, seed: int) -> Any:
    fill_random(host, seed)
    return host


def _pages(host: Any, first: int, count: int) -> list[bytes]:
    return [raw_page(host, (first + i) * PAGE) for i in range(count)]


def _sizes(host: Any) -> list[int]:
    return list(host.get_page_buffer_meta(tokens(0, 1))[1])


def _disk_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _lose_last_object(store: Any, key: str, host: Any) -> None:
    """Damage a stored page behind the store's back: its last object is lost."""
    if isinstance(store, FilePageStore):
        path = store._path(key)
        path.write_bytes(path.read_bytes()[: -_sizes(host)[-1]])
    else:
        assert store._client.remove(mooncake_key(key, store.page_format), True) == 0


@pytest.fixture
def target(store_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a child writer process reaches the same store as ``make_store``."""
    if store_kind == "file":
        return str(tmp_path / "l3")
    cluster: MooncakeCluster = request.getfixturevalue("mooncake_cluster")
    return cluster.address


class _Writer:
    """A ``_l3_writer.py`` child process."""

    def __init__(self, kind: str, target: str, seed: int, ns: str, rounds: int, *extra: str):
        args = [kind, target, str(seed), ns, str(rounds), *extra]
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_l3_writer.py"), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.last_round = -1

    def expect(self, prefix: str, timeout: float = 30) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("ROUND "):
                self.last_round = int(line.split()[1])
            if line.startswith(prefix):
                return line.strip()
        self.kill()
        err = self.proc.stderr.read() if self.proc.stderr else ""
        pytest.fail(f"writer did not print {prefix!r}: {err[-2000:]}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 60) -> None:
        _, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err[-2000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=10)


@contextlib.contextmanager
def _writers(*writers: _Writer) -> Iterator[None]:
    try:
        yield
    finally:
        for w in writers:
            if w.proc.poll() is None:
                w.kill()


# ------------------------------------------------------ page format identity
@pytest.mark.parametrize("differs", sorted(FORMAT_PAIRS))
def test_pool_of_another_format_gets_a_miss(
    make_store: StoreFactory, ns: str, differs: str
) -> None:
    make_a, make_b = FORMAT_PAIRS[differs]
    a, b = _fill(make_a(), 1), _fill(make_b(), 2)
    assert _sizes(a) == _sizes(b)  # only the meaning of the bytes differs
    assert page_format(a) != page_format(b)
    keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(a)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3

    store.register_host_pool(b)
    before = _pages(b, 0, 8)
    assert store.batch_exists(keys) == 0
    assert store.batch_get(keys, tokens(5, 3)) == [False] * 3
    assert _pages(b, 0, 8) == before
    # b stores its own pages under the same keys; neither replaces the other.
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    for host in (a, b, a):
        store.register_host_pool(host)
        assert store.batch_exists(keys) == 3
        assert store.batch_get(keys, tokens(5, 3)) == [True] * 3
        assert _pages(host, 5, 3) == _pages(host, 2, 3)
    assert not store.stats().errors.get("corrupt")


def test_pool_with_other_page_sizes_never_removes_pages(make_store: StoreFactory, ns: str) -> None:
    a = torch_host("page_first", seed=3)
    b = torch_host("page_first", kv_lora=32, seed=4)  # same object count, other size
    keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(a)
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    store.register_host_pool(b)
    before = _pages(b, 0, 8)
    assert store.batch_get(keys, tokens(5, 3)) == [False] * 3
    assert _pages(b, 0, 8) == before
    store.register_host_pool(a)
    assert store.batch_exists(keys) == 3
    assert store.batch_get(keys, tokens(5, 3)) == [True] * 3
    assert _pages(a, 5, 3) == _pages(a, 2, 3)
    assert not store.stats().errors.get("corrupt")


def test_page_format_fields() -> None:
    base = page_format(_IndexedPool())
    assert base == page_format(_IndexedPool())
    assert base.fingerprint == page_format(_IndexedPool()).fingerprint
    others = [
        page_format(SplitHostPool()),
        page_format(_IndexedPool((0, 2))),
        page_format(_IndexedPool(head_dim=16)),
        page_format(_IndexedPool(scale=False)),
        page_format(_IndexedPool(extra={"fp8_scales": "per_token"})),
    ]
    assert len({f.fingerprint for f in [base, *others]}) == 1 + len(others)
    doc = base.as_dict()
    assert doc["field:indexer_layer_ids"] == [0, 1]
    assert doc["field:index_k_scale_buffer"] == ["torch.float32", 1]
    assert "page_first_kv_split" in base.describe()
    torch_fmt = page_format(torch_host("layer_first")).as_dict()
    assert torch_fmt["field:kv_lora_rank"] == 64
    assert torch_fmt["field:qk_rope_head_dim"] == 16
    assert torch_fmt["dtype"] == "torch.bfloat16"
    for bad in ({"x": object()}, {"": 1}, {3: 1}, {"indexer_layer_ids": [0, 1]}):
        with pytest.raises(PageStoreArgumentError):
            page_format(_IndexedPool(extra=bad))  # type: ignore[arg-type]
    for not_a_pool in (object(), None, "pool"):
        with pytest.raises(PageStoreArgumentError):
            page_format(not_a_pool)  # type: ignore[arg-type]


def test_register_rejects_what_is_not_a_pool(make_store: StoreFactory) -> None:
    store = make_store()
    for bad in (object(), None, 42):
        with pytest.raises(PageStoreArgumentError):
            store.register_host_pool(bad)


# ------------------------------------------------------- whole-page commits
def test_rewrite_after_a_lost_object_is_one_write_not_a_mix(
    make_store: StoreFactory, ns: str
) -> None:
    a = torch_host("layer_first", seed=5)  # 4 objects per page, one per layer
    b = torch_host("layer_first", seed=6)
    keys = page_keys(list(range(PAGE)), PAGE, namespace=ns)
    store = make_store()
    store.register_host_pool(a)
    assert store.batch_set(keys, tokens(2, 1)) == [True]
    _lose_last_object(store, keys[0], a)

    store.register_host_pool(b)  # another writer, other bytes, same key
    assert store.batch_set(keys, tokens(2, 1)) == [True]
    reader = torch_host("layer_first")
    store.register_host_pool(reader)
    assert store.batch_get(keys, tokens(0, 1)) == [True]
    assert raw_page(reader, 0) in (raw_page(a, 2 * PAGE), raw_page(b, 2 * PAGE))


def test_concurrent_writers_and_readers_never_see_a_mix(make_store: StoreFactory, ns: str) -> None:
    # One pool: writer t stores host pages 2t, 2t+1 (different bytes) under the same keys.
    host = torch_host("layer_first", seed=7)
    expect = [_pages(host, 0, 2), _pages(host, 2, 2)]
    store = make_store()
    store.register_host_pool(host)
    rounds = 25
    barrier = threading.Barrier(2, timeout=30)
    errors: list[str] = []
    mixes = 0
    lock = threading.Lock()

    def check(first: int, r: int, got: list[bool]) -> None:
        nonlocal mixes
        for i, hit in enumerate(got):
            if hit and raw_page(host, (first + i) * PAGE) not in (expect[0][i], expect[1][i]):
                with lock:
                    mixes += 1

    def work(t: int) -> None:
        try:
            for r in range(rounds):
                keys = round_keys(ns, r, pages=2)
                barrier.wait()
                store.batch_set(keys, tokens(2 * t, 2))
                check(4 + 2 * t, r, store.batch_get(keys, tokens(4 + 2 * t, 2)))
        except Exception as exc:
            errors.append(repr(exc))
            barrier.abort()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors[0]
    reader = torch_host("layer_first")
    store.register_host_pool(reader)
    for r in range(rounds):
        assert store.batch_get(round_keys(ns, r, pages=2), tokens(0, 2)) == [True, True]
        for i in range(2):
            assert raw_page(reader, i * PAGE) in (expect[0][i], expect[1][i]), f"round {r}"
    assert mixes == 0


def test_concurrent_writer_processes_never_mix(
    make_store: StoreFactory, target: str, store_kind: str, ns: str
) -> None:
    rounds = 30
    a = _Writer(store_kind, target, 21, ns, rounds)
    b = _Writer(store_kind, target, 22, ns, rounds)
    with _writers(a, b):
        a.expect("READY")
        b.expect("READY")
        a.go()
        b.go()
        a.wait()
        b.wait()
    expect = [_pages(torch_host("layer_first", seed=s), 2, 3) for s in (21, 22)]
    reader = torch_host("layer_first")
    store = make_store()
    store.register_host_pool(reader)
    for r in range(rounds):
        assert store.batch_get(round_keys(ns, r), tokens(0, 3)) == [True] * 3
        for i in range(3):
            assert raw_page(reader, i * PAGE) in (expect[0][i], expect[1][i]), f"round {r}"


def test_writer_killed_at_random_points_leaves_whole_pages_or_misses(
    make_store: StoreFactory, target: str, store_kind: str, ns: str, tmp_path: Path
) -> None:
    rng = random.Random(0)
    expect = _pages(torch_host("layer_first", seed=31), 2, 3)
    reader = torch_host("layer_first")
    for attempt in range(2):
        w = _Writer(store_kind, target, 31, f"{ns}{attempt}/", 0)
        with _writers(w):
            w.expect("READY")
            w.go()
            w.expect(f"ROUND {rng.randrange(1, 4)}")
            time.sleep(rng.uniform(0, 0.02))
            w.kill()
        store = make_store()  # opens the directory after the kill
        store.register_host_pool(reader)
        hits = 0
        for r in range(w.last_round + 3):
            got = store.batch_get(round_keys(f"{ns}{attempt}/", r), tokens(0, 3))
            for i, hit in enumerate(got):
                if hit:
                    hits += 1
                    assert raw_page(reader, i * PAGE) == expect[i]
        assert hits >= 3 * (w.last_round + 1)
        if store_kind == "file":
            root = Path(target)
            assert not list((root / "tmp").iterdir())
            assert store.stats().stored_bytes == _disk_bytes(root)


# ------------------------------------------------ FilePageStore housekeeping
def test_clear_racing_set_keeps_byte_accounting(tmp_path: Path) -> None:
    host = torch_host("layer_first", seed=9)
    probe = FilePageStore(tmp_path / "probe")
    probe.register_host_pool(host)
    probe.batch_set(round_keys("p/", 0, pages=1), tokens(2, 1))
    per_page = probe.stats().stored_bytes
    assert per_page
    cap = 5 * per_page
    root = tmp_path / "l3"
    store = FilePageStore(root, capacity_bytes=cap)
    store.register_host_pool(host)
    stop = threading.Event()
    errors: list[str] = []
    seen: list[int] = []

    def write(t: int) -> None:
        try:
            for r in range(40):
                store.batch_set(round_keys(f"{t}/", r, pages=2), tokens(2 * t, 2))
        except Exception as exc:
            errors.append(repr(exc))

    def clear() -> None:
        while not stop.is_set():
            store.clear()
            time.sleep(0.002)

    def watch() -> None:
        while not stop.is_set():
            n = store.stats().stored_bytes
            assert n is not None
            if not 0 <= n <= cap:
                seen.append(n)

    writers = [threading.Thread(target=write, args=(t,)) for t in range(2)]
    others = [threading.Thread(target=clear), threading.Thread(target=watch)]
    for th in writers + others:
        th.start()
    for th in writers:
        th.join(60)
    stop.set()
    for th in others:
        th.join(60)
    assert not errors, errors[0]
    assert not seen, f"stored_bytes left [0, {cap}]: {seen[:5]}"
    stats = store.stats()
    assert stats.stored_bytes == _disk_bytes(root)
    assert stats.stored_bytes is not None and stats.stored_bytes <= cap
    store.close()  # a bounded store holds its root alone
    assert FilePageStore(root).stats().stored_bytes == _disk_bytes(root)


def test_temp_files_of_a_killed_writer_are_counted_then_removed(tmp_path: Path) -> None:
    root = tmp_path / "l3"
    FilePageStore(root)
    w = _Writer("file", str(root), 11, "k/", 1, "block-commit")
    with _writers(w):
        w.expect("READY")
        w.go()
        w.expect("BLOCKED")  # page bytes written, not yet committed
        leftovers = list((root / "tmp").iterdir())
        assert leftovers
        # A store opened while the writer lives counts its temp files and leaves them.
        live = FilePageStore(root)
        assert live.stats().stored_bytes == _disk_bytes(root) > 0
        assert all(p.exists() for p in leftovers)
        w.kill()
    fresh = FilePageStore(root)  # the writer is gone: its leftovers go
    assert not list((root / "tmp").iterdir())
    assert fresh.stats().stored_bytes == _disk_bytes(root) == 0
    assert live.stats().stored_bytes == 0
    fresh.register_host_pool(torch_host("layer_first"))
    assert fresh.batch_exists(round_keys("k/", 0)) == 0


@pytest.mark.parametrize(
    "case", ["none", "int", "empty", "blank", "nul", "bytes", "a_file", "under_a_file", "sysfs"]
)
def test_unusable_root_raises_a_typed_error(tmp_path: Path, case: str) -> None:
    a_file = tmp_path / "file"
    a_file.write_bytes(b"x")
    roots: dict[str, tuple[Any, type[Exception]]] = {
        "none": (None, PageStoreArgumentError),
        "int": (3, PageStoreArgumentError),
        "empty": ("", PageStoreArgumentError),
        "blank": ("  ", PageStoreArgumentError),
        "nul": (str(tmp_path / "a\x00b"), PageStoreArgumentError),
        "bytes": (os.fsencode(tmp_path / "b"), PageStoreArgumentError),
        "a_file": (a_file, PageStoreRootError),
        "under_a_file": (a_file / "sub", PageStoreRootError),
        "sysfs": ("/sys/sgl-l3-cannot-create/root", PageStoreRootError),  # read-only new root
    }
    root, error = roots[case]
    if case == "sysfs":
        probe = Path("/sys/sgl-l3-cannot-create")
        with contextlib.suppress(OSError):
            probe.mkdir()
            probe.rmdir()
            pytest.skip("/sys accepts new directories here")
    before = sorted(os.listdir("."))
    with pytest.raises(error):
        FilePageStore(root)
    assert sorted(os.listdir(".")) == before  # nothing created in the working directory


def test_read_only_parent_as_non_root(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("running as root: permission bits do not stop root")
        with pytest.raises(PageStoreRootError):
            FilePageStore(parent / "l3")
    finally:
        parent.chmod(0o755)


def test_root_removed_under_the_store_gives_false_not_oserror(tmp_path: Path) -> None:
    root = tmp_path / "l3"
    store = FilePageStore(root)
    host = torch_host("layer_first", seed=12)
    store.register_host_pool(host)
    keys = page_keys(list(range(3 * PAGE)), PAGE)
    assert store.batch_set(keys[:1], tokens(2, 1)) == [True]
    shutil.rmtree(root)
    assert store.batch_set(keys[1:], tokens(3, 2)) == [False, False]
    assert store.batch_exists(keys) == 0
    before = _pages(host, 5, 3)
    assert store.batch_get(keys, tokens(5, 3)) == [False] * 3
    assert _pages(host, 5, 3) == before
    store.clear()
    assert store.stats().stored_bytes == 0
    assert store.stats().errors["io_error"] >= 2


def test_corrupt_and_foreign_page_files_are_misses(tmp_path: Path) -> None:
    root = tmp_path / "l3"
    a = torch_host("page_first", seed=13)
    b = torch_host("page_first_direct", seed=14)  # equal size, other format
    keys = page_keys(list(range(2 * PAGE)), PAGE)
    store = FilePageStore(root)
    store.register_host_pool(b)
    assert store.batch_set(keys, tokens(2, 2)) == [True, True]
    foreign = store._path(keys[0]).read_bytes()
    store.register_host_pool(a)
    assert store.batch_set(keys, tokens(2, 2)) == [True, True]
    store._path(keys[0]).write_bytes(foreign)  # b's file under a's name
    path = store._path(keys[1])
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE - 9] ^= 1  # a header bit (payload length)
    path.write_bytes(bytes(data))
    before = _pages(a, 5, 2)
    assert store.batch_get(keys, tokens(5, 2)) == [False, False]
    assert _pages(a, 5, 2) == before
    assert store.stats().errors["corrupt"] == 2
    store.register_host_pool(b)  # b's own page is untouched
    assert store.batch_get(keys, tokens(5, 2)) == [True, True]
    assert _pages(b, 5, 2) == _pages(b, 2, 2)


# ------------------------------------------------- adversarial arguments
def test_unencodable_key_rejects_the_whole_batch(make_store: StoreFactory, ns: str) -> None:
    store = make_store()
    store.register_host_pool(torch_host("layer_first", seed=15))
    keys = [f"{ns}good", f"{ns}bad\ud800", f"{ns}good2"]
    for call in (store.batch_set, store.batch_get):
        with pytest.raises(PageStoreArgumentError):
            call(keys, tokens(2, 3))
    with pytest.raises(PageStoreArgumentError):
        store.batch_exists(keys)
    assert store.batch_exists([f"{ns}good"]) == 0  # nothing of the batch was written


@pytest.mark.parametrize("bad", [None, 5, "key", b"key", [1], [""], [None], ["a", "a"]])
def test_bad_keys_raise(make_store: StoreFactory, bad: Any) -> None:
    store = make_store()
    store.register_host_pool(torch_host("page_first"))
    with pytest.raises(PageStoreArgumentError):
        store.batch_exists(bad)
    with pytest.raises(PageStoreArgumentError):
        store.batch_set(bad, tokens(0, 1))


def test_odd_but_valid_keys_round_trip(make_store: StoreFactory, ns: str) -> None:
    host = torch_host("page_first", seed=16)
    store = make_store()
    store.register_host_pool(host)
    keys = [f"{ns}nul\x00key", f"{ns}" + "long" * 4096, f"{ns}ünï/çødé sp"]
    assert store.batch_set(keys, tokens(2, 3)) == [True] * 3
    assert store.batch_get(keys, tokens(5, 3)) == [True] * 3
    assert _pages(host, 5, 3) == _pages(host, 2, 3)


_PAGE4 = list(range(4 * PAGE, 5 * PAGE))
BAD_INDICES: dict[str, tuple[Any, type[Exception]]] = {
    "float_list": ([i + 0.5 for i in _PAGE4], IndexDTypeError),
    "float_tensor": (torch.tensor(_PAGE4, dtype=torch.float32), IndexDTypeError),
    "int32_tensor": (torch.tensor(_PAGE4, dtype=torch.int32), IndexDTypeError),
    "bool_list": ([True] * PAGE, IndexDTypeError),
    "bool_tensor": (torch.ones(PAGE, dtype=torch.bool), IndexDTypeError),
    "str": ("0" * PAGE, IndexDTypeError),
    "str_list": ([str(i) for i in _PAGE4], IndexDTypeError),
    "none": (None, IndexDTypeError),
    "float_numpy": (np.array(_PAGE4, dtype=np.float64), IndexDTypeError),
    "2d_tensor": (torch.tensor(_PAGE4).view(2, -1), IndexShapeError),
    "past_the_pool": (list(range(8 * PAGE, 9 * PAGE)), IndexOutOfRangeError),
    "negative": (list(range(-PAGE, 0)), IndexOutOfRangeError),
    "beyond_int64": ([2**70] * PAGE, IndexOutOfRangeError),
    "misaligned": (list(range(4 * PAGE + 1, 5 * PAGE + 1)), PageAlignmentError),
    "meta_tensor": (torch.empty(PAGE, dtype=torch.int64, device="meta"), DeviceError),
}


@pytest.mark.parametrize("case", sorted(BAD_INDICES))
def test_bad_host_indices_are_rejected_like_transfers(
    make_store: StoreFactory, ns: str, case: str
) -> None:
    indices, error = BAD_INDICES[case]
    host = torch_host("page_first", seed=17)
    store = make_store()
    store.register_host_pool(host)
    keys = page_keys(list(range(PAGE)), PAGE, namespace=ns)
    with pytest.raises(error) as info:
        store.batch_set(keys, indices)
    assert isinstance(info.value, PageStoreArgumentError)
    assert store.batch_exists(keys) == 0
    assert store.batch_set(keys, tokens(2, 1)) == [True]
    before = _pages(host, 0, 8)
    with pytest.raises(error):
        store.batch_get(keys, indices)
    assert _pages(host, 0, 8) == before


def test_numpy_int_indices_are_accepted(make_store: StoreFactory, ns: str) -> None:
    host = torch_host("page_first", seed=18)
    store = make_store()
    store.register_host_pool(host)
    keys = page_keys(list(range(PAGE)), PAGE, namespace=ns)
    assert store.batch_set(keys, np.arange(2 * PAGE, 3 * PAGE)) == [True]
    assert store.batch_get(keys, np.arange(5 * PAGE, 6 * PAGE, dtype=np.int32)) == [True]
    assert _pages(host, 5, 1) == _pages(host, 2, 1)


def test_two_keys_on_one_host_page_are_rejected(make_store: StoreFactory, ns: str) -> None:
    host = torch_host("page_first", seed=19)
    store = make_store()
    store.register_host_pool(host)
    keys = page_keys(list(range(2 * PAGE)), PAGE, namespace=ns)
    assert store.batch_set(keys, tokens(2, 2)) == [True, True]
    twice = torch.cat([tokens(5, 1), tokens(5, 1)])
    before = _pages(host, 0, 8)
    for call in (store.batch_get, store.batch_set):
        with pytest.raises(DuplicateIndexError) as info:
            call(keys, twice)
        assert isinstance(info.value, PageStoreArgumentError)
    assert _pages(host, 0, 8) == before


# ----------------------------------------------------------------- Mooncake
@pytest.mark.mooncake
def test_foreign_objects_under_a_page_key_are_misses(mooncake_store: Any, ns: str) -> None:
    host = torch_host("page_first", seed=23)
    store = mooncake_store
    store.register_host_pool(host)
    keys = page_keys(list(range(2 * PAGE)), PAGE, namespace=ns)
    fmt = store.page_format
    base = host.get_page_buffer_meta(tokens(4, 1))[0][0]  # registered host memory
    # Right size without a page header, and a wrong size: neither is a page.
    put = store._client.batch_put_from_multi_buffers(
        [mooncake_key(k, fmt) for k in keys],
        [[base], [base]],
        [[HEADER_SIZE + fmt.page_bytes], [fmt.page_bytes]],
    )
    assert put == [0, 0]
    assert store.batch_exists(keys) == 2
    before = _pages(host, 0, 8)
    assert store.batch_get(keys, tokens(0, 2)) == [False, False]
    assert _pages(host, 0, 8) == before
    assert store.stats().errors["corrupt"] >= 1
    assert store.batch_exists(keys[:1]) == 0  # removed, so it can be stored again
    store.remove(keys)
    assert store.batch_set(keys, tokens(2, 2)) == [True, True]
    assert store.batch_get(keys, tokens(5, 2)) == [True, True]
    assert _pages(host, 5, 2) == _pages(host, 2, 2)


@pytest.mark.mooncake
def test_master_restart_under_concurrent_writers(own_mooncake_cluster: MooncakeCluster) -> None:
    cluster = own_mooncake_cluster
    store = MooncakePageStore(MooncakeConfig(master_server_address=cluster.address))
    host = torch_host("layer_first", seed=25)
    expect = [_pages(host, 0, 2), _pages(host, 2, 2)]
    store.register_host_pool(host)
    stop = threading.Event()
    done = [0, 0]
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            r = 0
            while not stop.is_set() and r < 5000:
                time.sleep(0.005)
                store.batch_set(round_keys("mr/", r, pages=2), tokens(2 * t, 2))
                got = store.batch_get(round_keys("mr/", r, pages=2), tokens(4 + 2 * t, 2))
                for i, hit in enumerate(got):
                    page = raw_page(host, (4 + 2 * t + i) * PAGE)
                    if hit and page not in (expect[0][i], expect[1][i]):
                        errors.append(f"mixed page, round {r}")
                done[t] = r
                r += 1
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    try:
        for th in threads:
            th.start()
        time.sleep(0.5)
        cluster.kill_master()
        time.sleep(0.3)
        cluster.start_master()
        deadline = time.monotonic() + 30
        keys = round_keys("probe/", 0, pages=1)
        while store.batch_set(keys, tokens(6, 1)) != [True]:
            assert time.monotonic() < deadline, "store did not recover after the restart"
            time.sleep(0.3)
        at = list(done)
        while min(d - a for d, a in zip(done, at, strict=True)) < 3:
            assert time.monotonic() < deadline, "writers did not resume"
            time.sleep(0.05)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
        store.close()
    assert not errors, errors[:3]


# ------------------------------------------------------------- sgl-bench l3
def test_bench_starts_mooncake_only_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    from sgl_core.l3 import _bench, _mooncake_lib

    monkeypatch.setattr(_mooncake_lib, "mooncake_available", lambda: True)
    monkeypatch.setattr(_bench, "isolate_network", lambda: (False, "not allowed here"))

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Mooncake started outside a private network namespace")

    monkeypatch.setattr(_bench, "mooncake_on_loopback", never)
    notes: list[str] = []
    with _bench.default_store_factories(1 << 20, 2, notes=notes) as factories:
        assert sorted(factories) == ["file"]
    assert any("mooncake: skipped: not allowed here" in n for n in notes)


BENCH_ARGS = ("--pages", "2", "--layers", "2", "--page-size", "16", "--repeats", "1")


def test_sgl_bench_l3_says_where_mooncake_listens(tmp_path: Path) -> None:
    out = tmp_path / "l3.json"
    done = subprocess.run(
        [sys.executable, "-m", "sgl_core.cli.main", "l3", *BENCH_ARGS, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stdout.splitlines() if line.startswith("mooncake:")]
    assert len(notes) == 1, done.stdout
    note = notes[0]
    assert "skipped" in note or "network namespace with only loopback" in note
    import json

    doc = json.loads(out.read_text())
    assert doc["notes"] == [note]
    stores = {r["store"] for r in doc["records"]}
    assert ("mooncake" in stores) == ("skipped" not in note)
