"""Forced removal racing a read on a real master: Mooncake may hand the freed range to another put.

The read then copies the page header intact and a payload partly of another
object; without the payload CRC that was a wrong hit (seen in about 2 of 5 runs
of this test). Bounded: 5 s of churn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
import torch
from _mooncake_cluster import MooncakeCluster

from sgl_core import HostLayout

PAGE_TOKENS = 16
PAGE_BYTES = 4 << 20


class _BigPool:
    """One 4 MiB object per page, 4 pages: long transfers widen the race window."""

    layout = HostLayout.PAGE_FIRST

    def __init__(self) -> None:
        self.page_size = PAGE_TOKENS
        self.size = 4 * PAGE_TOKENS
        self.layer_num = 1
        self.dtype = torch.uint8
        self.buf = torch.zeros(4, PAGE_BYTES, dtype=torch.uint8)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        pages = [int(s) // PAGE_TOKENS for s in idx[::PAGE_TOKENS].tolist()]
        return [self.buf[p].data_ptr() for p in pages], [PAGE_BYTES] * len(pages)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        return [self.buf.data_ptr()], [self.buf.numel()], [PAGE_BYTES]


def _slot(p: int) -> torch.Tensor:
    return torch.arange(p * PAGE_TOKENS, (p + 1) * PAGE_TOKENS, dtype=torch.int64)


@pytest.mark.mooncake
def test_forced_remove_racing_a_read_is_never_a_wrong_hit(
    own_mooncake_cluster: MooncakeCluster,
) -> None:
    from sgl_core.l3 import MooncakeConfig, MooncakePageStore

    cfg = MooncakeConfig(master_server_address=own_mooncake_cluster.address)
    reader, churn = MooncakePageStore(cfg), MooncakePageStore(cfg)
    host = _BigPool()
    g = torch.Generator().manual_seed(0)
    host.buf[0] = torch.randint(0, 256, (PAGE_BYTES,), dtype=torch.uint8, generator=g)
    host.buf[2] = torch.randint(0, 256, (PAGE_BYTES,), dtype=torch.uint8, generator=g)
    want = host.buf[0].clone()
    reader.register_host_pool(host)  # type: ignore[arg-type]
    churn.register_host_pool(host)  # type: ignore[arg-type]
    key = "race/page"
    assert churn.batch_set([key], _slot(0)) == [True]
    stop = threading.Event()
    bad: list[str] = []
    hits = [0]

    def read(slot: int) -> None:
        while not stop.is_set():
            if reader.batch_get([key], _slot(slot)) == [True]:
                hits[0] += 1
                got = host.buf[slot]
                if not torch.equal(got, want):
                    same, other = int((got == want).sum()), int((got == host.buf[2]).sum())
                    bad.append(f"wrong hit: {same} bytes of the page, {other} of another")
                    stop.set()

    threads = [threading.Thread(target=read, args=(slot,)) for slot in (1,)]
    for th in threads:
        th.start()
    try:
        deadline = time.monotonic() + 5
        i = 0
        while time.monotonic() < deadline and not stop.is_set():
            churn.remove([key])
            other = f"race/other{i}"
            churn.batch_set([other], _slot(2))
            churn.remove([other])
            churn.batch_set([key], _slot(0))
            i += 1
    finally:
        stop.set()
        for th in threads:
            th.join(30)
        reader.close()
        churn.close()
    print("rounds", i, "hits", hits[0], reader.stats().errors)
    assert not bad, bad
