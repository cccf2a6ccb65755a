"""Child process: write pages to an L3 store, round after round (for the fault tests).

Usage: python _l3_writer.py KIND TARGET SEED NAMESPACE ROUNDS [block-commit]

KIND is ``file`` (TARGET: the store's root) or ``mooncake`` (TARGET: the
master's address). The host pool is ``layer_first`` (one object per layer),
every page random from SEED (``fill_random``). Round ``r`` stores host pages
2..4 under ``round_keys(NAMESPACE, r)``. Prints ``READY``, waits for a line
on stdin, then prints ``ROUND r`` after each round; ROUNDS=0 never stops.
``block-commit`` makes the file store's rename block forever after printing
``BLOCKED``: a writer stopped with its page written but not yet committed.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from _l3_helpers import round_keys, tokens, torch_host


def _block(*args: Any, **kwargs: Any) -> None:
    print("BLOCKED", flush=True)
    time.sleep(3600)


def main() -> int:
    kind, target, seed, namespace, rounds = sys.argv[1:6]
    host = torch_host("layer_first", seed=int(seed))
    store: Any
    if kind == "file":
        from sgl_core.l3 import FilePageStore

        store = FilePageStore(target)
    else:
        from sgl_core.l3 import MooncakeConfig, MooncakePageStore

        store = MooncakePageStore(MooncakeConfig(master_server_address=target))
    store.register_host_pool(host)
    if "block-commit" in sys.argv[6:]:
        os.replace = _block
    print("READY", flush=True)
    sys.stdin.readline()
    r = 0
    while int(rounds) == 0 or r < int(rounds):
        store.batch_set(round_keys(namespace, r), tokens(2, 3))
        print(f"ROUND {r}", flush=True)
        r += 1
    if kind != "file":
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
