"""Keep Mooncake's listeners off the network: a private network namespace with only loopback.

The Mooncake client's transfer-engine listeners (P2P handshake RPC, TCP
transport) bind every interface on ephemeral ports, and this client version
has no setting that binds them to loopback (see
:mod:`sgl_core.l3._mooncake_lib`). Code that runs a throwaway Mooncake store
on one machine (``sgl-bench l3``, the tests) therefore runs it in a private
network namespace whose only interface is ``lo``: nothing outside the
process tree can reach those listeners.

:func:`enter_private_netns` moves the **calling thread** (and so every
thread and process it starts afterwards) into a new network namespace; call
it from the main thread before starting Mooncake. It needs ``CAP_SYS_ADMIN``
(root); it never changes anything when it fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import socket
import struct

__all__ = ["enter_private_netns", "isolate_network", "loopback_only"]

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

    Done at most once per process: later calls answer the first call's result.
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
