"""Fixtures for the L3 store tests: a real ``mooncake_master`` on loopback and a segment holder.

The Mooncake client's transfer-engine listeners bind every interface (see
``sgl_core.l3._mooncake_lib``). When the tests run as root and the kernel
allows it, the first Mooncake fixture moves this test process (and so every
process it starts) into a private network namespace whose only interface is
loopback, so nothing can be reached or listened on beyond 127.0.0.1. Set
``SGLTEST_L3_NETNS=0`` to skip that. Without the Mooncake client installed the
Mooncake tests skip, unless ``SGLTEST_REQUIRE_MOONCAKE=1`` (CI), where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _mooncake_cluster import MooncakeCluster, enter_private_netns


def _require_mooncake() -> None:
    if importlib.util.find_spec("mooncake") is None:
        if os.environ.get("SGLTEST_REQUIRE_MOONCAKE") == "1":
            pytest.fail("SGLTEST_REQUIRE_MOONCAKE=1 but the Mooncake client is not installed")
        pytest.skip("Mooncake client not installed (pip install './packages/core[mooncake]')")
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        if os.environ.get("SGLTEST_REQUIRE_MOONCAKE") == "1":
            pytest.fail(f"cannot import mooncake.store: {exc}")
        pytest.skip(f"cannot import mooncake.store: {exc} (apt-get install -y libibverbs1)")


def _new_cluster(factory: pytest.TempPathFactory) -> MooncakeCluster:
    _require_mooncake()
    enter_private_netns()
    return MooncakeCluster(factory.mktemp("mooncake")).start()


@pytest.fixture(scope="session")
def mooncake_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeCluster]:
    """A master and a segment holder shared by the session's Mooncake tests."""
    cluster = _new_cluster(tmp_path_factory)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_mooncake_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeCluster]:
    """A private master and holder, for tests that kill the master."""
    cluster = _new_cluster(tmp_path_factory)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def mooncake_store(mooncake_cluster: MooncakeCluster) -> Iterator[Any]:
    """One in-process Mooncake client (no segment of its own) for the whole session."""
    from sgl_core.l3 import MooncakeConfig, MooncakePageStore

    store = MooncakePageStore(MooncakeConfig(master_server_address=mooncake_cluster.address))
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(params=["file", pytest.param("mooncake", marks=pytest.mark.mooncake)])
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def make_store(
    store_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], Any]]:
    """``make_store()`` -> a store of ``store_kind``, emptied at teardown.

    File stores made by one test share a directory (a second one sees the
    first one's pages); Mooncake stores are the session's one client.
    """
    made: list[Any] = []
    if store_kind == "file":
        from sgl_core.l3 import FilePageStore

        def make() -> Any:
            store = FilePageStore(tmp_path / "l3")
            made.append(store)
            return store
    else:
        store = request.getfixturevalue("mooncake_store")

        def make() -> Any:
            made.append(store)
            return store

    yield make
    if made:
        made[0].clear()


@pytest.fixture
def ns(request: pytest.FixtureRequest) -> str:
    """A key namespace unique to this test."""
    return f"{request.node.name}/"
