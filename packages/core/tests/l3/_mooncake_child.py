"""Child process: read pages another process stored, into fresh pools, and check them.

Usage: python _mooncake_child.py MASTER_ADDR SEED LAYOUT [LAYOUT ...]
For each layout: a fresh host pool gets the 3 pages keyed
``page_keys(range(48), 16, namespace=f"{LAYOUT}/{SEED}/")`` into host pages 4..6,
compares them bit-exactly with the writer's pages (regenerated from SEED), and
for torch layouts loads them layer by layer into a fresh device pool and
compares with the writer's device pool. Prints ``OK`` or ``MISMATCH ...``.
"""

from __future__ import annotations

import sys

import torch
from _l3_helpers import PAGE, device_matches, filled_host, make_host, page_bytes, tokens

from sgl_core.l3 import MooncakeConfig, MooncakePageStore, page_keys


def main() -> int:
    master, seed, layouts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    store = MooncakePageStore(MooncakeConfig(master_server_address=master))
    bad = []
    try:
        for layout in layouts:
            expected, dev = filled_host(layout, seed)
            host = make_host(layout)
            store.register_host_pool(host)
            keys = page_keys(list(range(48)), PAGE, namespace=f"{layout}/{seed}/")
            if store.batch_exists(keys) != 3:
                bad.append(f"{layout}: exists")
                continue
            if store.batch_get(keys, tokens(4, 3)) != [True] * 3:
                bad.append(f"{layout}: get")
                continue
            for i in range(3):
                if not torch.equal(
                    page_bytes(host, (4 + i) * PAGE), page_bytes(expected, (2 + i) * PAGE)
                ):
                    bad.append(f"{layout}: page {i} bytes")
            if dev is not None and not device_matches(host, 4, dev):
                bad.append(f"{layout}: device pool")
    finally:
        store.close()
    print("OK" if not bad else "MISMATCH " + "; ".join(bad), flush=True)
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
