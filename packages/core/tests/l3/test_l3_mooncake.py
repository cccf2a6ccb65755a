"""MooncakePageStore against a real mooncake_master on loopback."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from _l3_helpers import (
    PAGE,
    TORCH_LAYOUTS,
    fill_sentinel,
    filled_host,
    make_host,
    page_bytes,
    tokens,
)
from _mooncake_cluster import MooncakeCluster

from sgl_core.l3 import MooncakeConfig, MooncakePageStore, PageStoreArgumentError, page_keys
from sgl_core.l3._mooncake_lib import ERROR_NAMES, error_name

pytestmark = pytest.mark.mooncake


def test_fresh_process_reads_what_this_one_stored(
    mooncake_cluster: MooncakeCluster, mooncake_store: Any
) -> None:
    seed = 31
    for layout in TORCH_LAYOUTS:
        host, _ = filled_host(layout, seed)
        mooncake_store.register_host_pool(host)
        keys = page_keys(list(range(3 * PAGE)), PAGE, namespace=f"{layout}/{seed}/")
        assert mooncake_store.batch_set(keys, tokens(2, 3)) == [True] * 3
    done = mooncake_cluster.child(str(seed), *TORCH_LAYOUTS)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK")


def test_master_down_fails_cleanly_and_recovers(own_mooncake_cluster: MooncakeCluster) -> None:
    cluster = own_mooncake_cluster
    store = MooncakePageStore(MooncakeConfig(master_server_address=cluster.address))
    try:
        src, _ = filled_host("layer_first", seed=41)
        store.register_host_pool(src)
        keys = page_keys(list(range(3 * PAGE)), PAGE, namespace="down/")
        assert store.batch_set(keys, tokens(2, 3)) == [True] * 3

        cluster.kill_master()
        dst = make_host("layer_first")
        store.register_host_pool(dst)
        fill_sentinel(dst, 0, 8)
        before = [page_bytes(dst, p * PAGE) for p in range(8)]
        assert store.batch_exists(keys) == 0
        assert store.batch_get(keys, tokens(0, 3)) == [False] * 3
        assert store.batch_set(keys, tokens(4, 3)) == [False] * 3
        assert all(torch.equal(page_bytes(dst, p * PAGE), before[p]) for p in range(8))
        assert store.stats().errors.get("RPC_FAIL", 0) > 0

        cluster.start_master()  # same address; the new master starts empty
        store.register_host_pool(src)
        deadline = time.monotonic() + 30
        while store.batch_set(keys, tokens(2, 3)) != [True] * 3:
            assert time.monotonic() < deadline, "store did not recover after the master restart"
            time.sleep(0.5)
        store.register_host_pool(dst)
        assert store.batch_exists(keys) == 3
        assert store.batch_get(keys, tokens(0, 3)) == [True] * 3
        for i in range(3):
            assert torch.equal(page_bytes(dst, i * PAGE), page_bytes(src, (2 + i) * PAGE))
    finally:
        store.close()


def test_failed_transfer_restores_host_bytes(mooncake_store: Any) -> None:
    """A page whose objects exist but whose transfer fails leaves the host as it was."""
    src, _ = filled_host("page_first", seed=51)
    mooncake_store.register_host_pool(src)
    keys = page_keys(list(range(2 * PAGE)), PAGE, namespace="restore/")
    assert mooncake_store.batch_set(keys, tokens(2, 2)) == [True, True]

    dst = make_host("page_first")
    mooncake_store.register_host_pool(dst)
    fill_sentinel(dst, 0, 2)
    before = page_bytes(dst, PAGE)
    real = mooncake_store._client

    class HalfFails:
        """The real client, but the second page of a get reports TRANSFER_FAIL."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def batch_get_into_multi_buffers(self, *args: Any) -> list[int]:
            codes = real.batch_get_into_multi_buffers(*args)  # bytes land in the host pool...
            return [codes[0], -800]  # ...but the second page reports TRANSFER_FAIL

    mooncake_store._client = HalfFails()
    try:
        assert mooncake_store.batch_get(keys, tokens(0, 2)) == [True, False]
    finally:
        mooncake_store._client = real
    assert torch.equal(page_bytes(dst, PAGE), before)
    assert torch.equal(page_bytes(dst, 0), page_bytes(src, 2 * PAGE))
    assert mooncake_store.stats().errors["TRANSFER_FAIL"] >= 1


def test_config_validation() -> None:
    with pytest.raises(PageStoreArgumentError, match="master_server_address"):
        MooncakeConfig(master_server_address="nohost")
    with pytest.raises(PageStoreArgumentError, match="global_segment_size"):
        MooncakeConfig(global_segment_size=-1)
    with pytest.raises(PageStoreArgumentError, match="protocol"):
        MooncakeConfig(protocol="udp")


def test_error_names() -> None:
    assert error_name(-704) == "OBJECT_NOT_FOUND"
    assert error_name(-900) == "RPC_FAIL"
    assert error_name(-12345) == "ERROR_-12345"
    assert ERROR_NAMES[0] == "OK"
