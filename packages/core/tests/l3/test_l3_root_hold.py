"""One capacity per root: a bounded ``FilePageStore`` holds its root alone, across processes.

Two bounded stores on one root would each fill ``capacity_bytes`` (2·C on
disk). A bounded store therefore holds ``<root>/store.lock`` exclusively, an
unbounded one shares it; the hold is an ``flock``, so it ends with
``close()``, with the store, or with its process (a SIGKILL included). A
refused open reads, counts and removes nothing.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _l3_helpers import round_keys, tokens, torch_host

from sgl_core.l3 import FilePageStore, PageStoreRootError, PageStoreRootInUseError

_HOLDER = textwrap.dedent(
    """
    import sys
    from sgl_core.l3 import FilePageStore
    cap = None if sys.argv[2] == "none" else int(sys.argv[2])
    store = FilePageStore(sys.argv[1], cap)
    print("READY", flush=True)
    sys.stdin.readline()
    """
)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """A root with three pages on it, written by a store that is gone again."""
    root = tmp_path / "l3"
    store = FilePageStore(root)
    store.register_host_pool(torch_host("layer_first", seed=5))
    assert store.batch_set(round_keys("a/", 0), tokens(2, 3)) == [True] * 3
    del store  # a collected store releases its root
    gc.collect()
    return root


class _Holder:
    """A child process holding a store on ``root`` until killed."""

    def __init__(self, root: Path, capacity: int | None) -> None:
        cap = "none" if capacity is None else str(capacity)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(root), cap],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.kill()
            pytest.fail(
                f"holder did not start: {self.proc.stderr.read() if self.proc.stderr else ''}"
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)


@pytest.mark.parametrize("held_by", [10**9, None], ids=["bounded", "unbounded"])
def test_bounded_store_refused_while_another_process_holds_the_root(
    stored: Path, held_by: int | None
) -> None:
    holder = _Holder(stored, held_by)
    try:
        before = _tree(stored)
        with pytest.raises(PageStoreRootInUseError, match="capacity_bytes"):
            FilePageStore(stored, capacity_bytes=10**9)
        if held_by is not None:  # a bounded holder keeps unbounded stores out too
            with pytest.raises(PageStoreRootInUseError):
                FilePageStore(stored)
        else:  # unbounded stores share a root
            FilePageStore(stored).close()
        assert _tree(stored) == before  # the refused open changed nothing on disk
    finally:
        holder.kill()
    # The holder was SIGKILLed: the kernel dropped its lock, the root opens again.
    again = FilePageStore(stored, capacity_bytes=10**9)
    again.register_host_pool(torch_host("layer_first", seed=5))
    assert again.batch_exists(round_keys("a/", 0)) == 3
    assert isinstance(PageStoreRootInUseError("x"), PageStoreRootError)


def test_hold_ends_with_close_or_the_store(stored: Path) -> None:
    first = FilePageStore(stored, capacity_bytes=10**9)
    with pytest.raises(PageStoreRootInUseError):
        FilePageStore(stored, capacity_bytes=10**9)  # in one process too
    first.close()
    first.close()  # idempotent
    second = FilePageStore(stored, capacity_bytes=10**9)
    del second
    gc.collect()
    FilePageStore(stored, capacity_bytes=10**9).close()
