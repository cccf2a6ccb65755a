"""The only module that imports ``mooncake``, and the facts about its store client relied on.

Facts relied on (``mooncake-transfer-engine-non-cuda`` 0.3.13.post1, read from
the installed package's docstrings and ``mooncake_master --help`` and checked
against a live master on loopback):

* Native modules link against ``libibverbs.so.1`` even for TCP: on Debian,
  ``apt-get install -y libibverbs1``. The wheel ships ``mooncake_master``
  (console script, also ``mooncake/mooncake_master`` in the package).
* Master: ``mooncake_master --rpc_address=127.0.0.1 --rpc_port=P
  --metrics_host=127.0.0.1 --metrics_port=M`` binds both to loopback.
  ``--enable_http_metadata_server`` exists, but its server binds 0.0.0.0
  whatever ``--http_metadata_server_host`` says, so we use the P2P handshake
  (``metadata_server="P2PHANDSHAKE"``), which needs no metadata server.
  ``--default_kv_lease_ttl`` (ms) is how long a read pins an object against
  ``remove``/eviction (default 10000); ``--eviction_high_watermark_ratio``
  (0.9) and ``--eviction_ratio`` (0.05) drive eviction when segments fill.
* ``MooncakeDistributedStore().setup(local_hostname, metadata_server,
  global_segment_size, local_buffer_size, protocol, rdma_devices,
  master_server_addr) -> int`` (0 = ok). ``global_segment_size`` bytes of this
  process join the distributed pool (0: a pure client; another process must
  mount a segment); ``local_buffer_size`` is the client's staging buffer,
  unused by the zero-copy ``*_from``/``*_into`` calls (0 works).
* ``register_buffer(ptr, size) -> int`` (0 = ok), ``unregister_buffer(ptr)``.
* ``batch_put_from_multi_buffers(keys, ptrs, sizes)`` /
  ``batch_get_into_multi_buffers(keys, ptrs, sizes)``: one object per key
  made of (read into) several buffers, ``ptrs[i]``/``sizes[i]`` a list per
  key. The put answers 0 per stored key; a key that already exists keeps its
  first object whole (the store takes 0 or ``OBJECT_ALREADY_EXISTS``). The get
  answers the object's size, ``INVALID_PARAMS`` when the buffers are
  smaller than the object and ``TRANSFER_FAIL`` when larger (checked: no
  byte of the destination buffers is written in either case).
* Every buffer a transfer touches must be registered (``register_buffer``):
  with unregistered buffers the calls still answered success, but the bytes
  that arrived were garbage.
* ``batch_is_exist(keys) -> list[int]``: 1, 0, or negative on error.
  ``batch_remove(keys, force) -> list[int]``: 0 or an error code per key.
* ``remove(key, force=False) -> int``, ``remove_all(force=False) -> int``
  (``force`` skips lease checks), ``close() -> int``.
* Error codes (``mooncake-store/include/types.h``): see :data:`ERROR_NAMES`.
  With the master down, calls answer ``RPC_FAIL`` (-900) after the client's
  reconnect attempt (about 4 s per call); once a master listens again at the
  same address, clients remount their segments and calls succeed (the new
  master starts empty).
* The client's transfer-engine listeners (P2P handshake RPC, TCP transport)
  bind 0.0.0.0/[::] on ephemeral ports; ``MC_TCP_BIND_ADDRESS`` does not
  change that in this version. So code that runs a throwaway store on one
  machine (``sgl-bench l3``, the tests) runs it in a private network namespace
  whose only interface is ``lo`` (:func:`isolate_network`): nothing outside
  the process tree can reach those listeners.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import importlib
import importlib.util
import os
import shutil
import socket
import struct
from pathlib import Path
from typing import Any

from sgl_core.l3._protocol import MooncakeUnavailableError

__all__ = [
    "ERROR_NAMES",
    "OBJECT_ALREADY_EXISTS",
    "OBJECT_NOT_FOUND",
    "enter_private_netns",
    "error_name",
    "isolate_network",
    "loopback_only",
    "master_binary",
    "mooncake_available",
    "new_store",
]

#: How to get the client: the README's install (sgl-core is on no package index yet).
MOONCAKE_INSTALL = "from the repository: pip install './packages/core[mooncake]'"

OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705

#: Mooncake store ``ErrorCode`` values and their names.
ERROR_NAMES: dict[int, str] = {
    0: "OK",
    -1: "INTERNAL_ERROR",
    -10: "BUFFER_OVERFLOW",
    -100: "SHARD_INDEX_OUT_OF_RANGE",
    -101: "SEGMENT_NOT_FOUND",
    -102: "SEGMENT_ALREADY_EXISTS",
    -200: "NO_AVAILABLE_HANDLE",
    -300: "INVALID_VERSION",
    -400: "INVALID_KEY",
    -500: "WRITE_FAIL",
    -600: "INVALID_PARAMS",
    -601: "ILLEGAL_CLIENT",
    -700: "INVALID_WRITE",
    -701: "INVALID_READ",
    -702: "INVALID_REPLICA",
    -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -708: "OBJECT_HAS_REPLICATION_TASK",
    -709: "OBJECT_NO_REPLICATION_TASK",
    -710: "REPLICA_NOT_FOUND",
    -711: "REPLICA_ALREADY_EXISTS",
    -712: "REPLICA_IS_GONE",
    -713: "REPLICA_NOT_IN_LOCAL_MEMORY",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
    -1000: "ETCD_OPERATION_ERROR",
    -1001: "ETCD_KEY_NOT_EXIST",
    -1002: "ETCD_TRANSACTION_FAIL",
    -1003: "ETCD_CTX_CANCELLED",
    -1010: "UNAVAILABLE_IN_CURRENT_STATUS",
    -1011: "UNAVAILABLE_IN_CURRENT_MODE",
    -1100: "FILE_NOT_FOUND",
    -1101: "FILE_OPEN_FAIL",
}


def error_name(code: int) -> str:
    """``ERROR_NAMES[code]``, or ``"ERROR_<code>"`` for a code this table lacks."""
    return ERROR_NAMES.get(code, f"ERROR_{code}")


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        hint = (
            "install libibverbs1 (apt-get install -y libibverbs1)"
            if "libibverbs" in str(exc)
            else MOONCAKE_INSTALL
        )
        raise MooncakeUnavailableError(f"cannot import {name}: {exc}; {hint}") from exc


def mooncake_available() -> bool:
    """True when ``mooncake.store`` imports (client wheel and libibverbs present)."""
    try:
        _import("mooncake.store")
    except MooncakeUnavailableError:
        return False
    return True


def master_binary() -> str:
    """Path of the ``mooncake_master`` executable shipped with the wheel."""
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "mooncake_master"
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    found = shutil.which("mooncake_master")
    if found is None:
        raise MooncakeUnavailableError(f"mooncake_master not found; {MOONCAKE_INSTALL}")
    return found


def new_store() -> Any:
    """A fresh ``mooncake.store.MooncakeDistributedStore``, not yet set up.

    Its calls answer Mooncake's integer codes (facts above); the page store
    maps them to results.
    """
    return _import("mooncake.store").MooncakeDistributedStore()


_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40


def loopback_only() -> bool:
    """True when this thread's network namespace has no interface but ``lo``."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return False
    return names <= {"lo"}


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sh22x", b"lo", _IFF_UP_LOOPBACK_RUNNING)
        fcntl.ioctl(s, _SIOCSIFFLAGS, ifr)


@functools.cache
def enter_private_netns() -> bool:
    """Move this thread into a new network namespace with only ``lo`` (up); False if not allowed.

    The calling thread, and so every thread and process it starts afterwards:
    call it from the main thread before starting Mooncake. It needs
    ``CAP_SYS_ADMIN`` (root) and changes nothing when it fails. Done at most
    once per process: later calls answer the first call's result.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) != 0:
        return False
    _loopback_up()
    return True


def isolate_network() -> tuple[bool, str]:
    """Make sure listeners opened from now on are reachable from this machine's loopback only.

    Returns ``(True, how)`` when this thread is (now) in a network namespace
    with only ``lo``, else ``(False, why not)``.
    """
    if enter_private_netns.cache_info().currsize and enter_private_netns():
        return True, "in a private network namespace with only loopback (entered by this process)"
    if loopback_only():
        with contextlib.suppress(OSError):
            _loopback_up()
        return True, "in a network namespace with only loopback"
    if enter_private_netns():
        return True, "moved into a private network namespace with only loopback (127.0.0.1)"
    return False, "cannot enter a private network namespace (needs root or CAP_SYS_ADMIN)"
