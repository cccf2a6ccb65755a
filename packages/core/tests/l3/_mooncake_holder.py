"""Child process: join a Mooncake store with a global segment and hold it until SIGTERM.

Usage: python _mooncake_holder.py MASTER_ADDR SEGMENT_BYTES
Prints ``READY`` once mounted (``FAILED <rc>`` otherwise).
"""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> int:
    from sgl_core.l3._mooncake_lib import new_store

    client = new_store()
    # local hostname, metadata server, global segment, local buffer, protocol, RDMA devices, master
    rc = client.setup("127.0.0.1", "P2PHANDSHAKE", int(sys.argv[2]), 0, "tcp", "", sys.argv[1])
    print("READY" if rc == 0 else f"FAILED {rc}", flush=True)
    if rc != 0:
        return 1
    # Exit without Mooncake's teardown (it can block while the master is gone).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
