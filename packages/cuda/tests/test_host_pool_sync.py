"""Two threads waiting for the host pool's queued transfers must both wait.

``CudaMLAHostPool.synchronize`` (run by ``get_page_buffer_meta`` and the
other L3 page helpers) once swapped out the pending events before waiting on
them, so a second thread that arrived meanwhile found none and read host
memory while the first thread's device-to-host copy was still running: an L3
``batch_set`` there would store stale bytes, with a valid checksum, under the
page's key. The events are stood in for by objects whose ``synchronize``
blocks until released, so this runs without a GPU.
"""

from __future__ import annotations

import threading

import torch

from sgl_cuda import CudaMLAHostPool, backend


class _SlowEvent:
    def __init__(self) -> None:
        self.waiting = threading.Event()
        self.done = threading.Event()

    def synchronize(self) -> None:
        self.waiting.set()
        assert self.done.wait(10)


def test_a_second_waiter_waits_for_the_transfer() -> None:
    dev = backend.create_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )
    host = backend.create_host_pool(dev, layout="layer_first", io_backend="direct")
    assert isinstance(host, CudaMLAHostPool)
    event = _SlowEvent()
    host.fence._pending = {1: event}  # type: ignore[dict-item]  # a copy queued on stream 1
    first = threading.Thread(target=host.synchronize)
    first.start()
    assert event.waiting.wait(10)
    second_back = threading.Event()

    def second() -> None:
        host.get_page_buffer_meta(torch.arange(4, dtype=torch.int64))
        second_back.set()

    th = threading.Thread(target=second)
    th.start()
    try:
        # the copy has not finished: the second reader must not have its pointers yet
        assert not second_back.wait(0.5)
    finally:
        event.done.set()
        first.join(10)
        th.join(10)
    assert second_back.is_set()
