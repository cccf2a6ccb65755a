"""A real Mooncake store on loopback for the tests: master, segment holder, private netns."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SEGMENT_BYTES = 256 << 20


def enter_private_netns() -> bool:
    """Move this process into a new network namespace with only ``lo``.

    ``SGLTEST_L3_NETNS=0``: do not (stay in the current namespace).
    """
    if os.environ.get("SGLTEST_L3_NETNS", "1") == "0":
        return False
    from sgl_core.l3._mooncake_lib import enter_private_netns as enter

    return enter()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class MooncakeCluster:
    """``mooncake_master`` on 127.0.0.1 plus one process holding a global segment."""

    def __init__(self, workdir: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.workdir = workdir
        self.segment_bytes = segment_bytes
        self.rpc_port = _free_port()
        self.metrics_port = _free_port()
        self.address = f"127.0.0.1:{self.rpc_port}"
        self.master: subprocess.Popen[bytes] | None = None
        self.holder: subprocess.Popen[bytes] | None = None

    def start_master(self) -> None:
        from sgl_core.l3._mooncake_lib import master_binary

        log = open(self.workdir / "master.log", "ab")  # noqa: SIM115 - owned by the child
        self.master = subprocess.Popen(
            [
                master_binary(),
                "--rpc_address=127.0.0.1",
                f"--rpc_port={self.rpc_port}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={self.metrics_port}",
                "--default_kv_lease_ttl=200",
                "--rpc_thread_num=2",
                "--logtostderr",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        if not _wait_port(self.rpc_port, 20):
            self.stop()
            pytest.fail(f"mooncake_master did not listen on {self.address}")

    def kill_master(self) -> None:
        if self.master is not None:
            self.master.kill()
            self.master.wait(5)
            self.master = None

    def start_holder(self) -> None:
        log = open(self.workdir / "holder.log", "ab")  # noqa: SIM115 - owned by the child
        self.holder = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_mooncake_holder.py"),
                self.address,
                str(self.segment_bytes),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        assert self.holder.stdout is not None
        ready, _, _ = select.select([self.holder.stdout], [], [], 30)
        line = self.holder.stdout.readline().decode().strip() if ready else "timeout"
        if line != "READY":
            self.stop()
            pytest.fail(f"segment holder did not start: {line}")

    def start(self) -> MooncakeCluster:
        self.start_master()
        self.start_holder()
        return self

    def stop(self) -> None:
        _stop(self.holder)
        self.holder = None
        _stop(self.master)
        self.master = None

    def child(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``_mooncake_child.py`` against this cluster in a fresh interpreter."""
        return subprocess.run(
            [sys.executable, str(HERE / "_mooncake_child.py"), self.address, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
