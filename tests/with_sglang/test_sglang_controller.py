"""SGLang's HiCacheController and L2TransferEngine on our host pools (CPU).

The controller is built with its real ``__init__``: without a storage
backend it creates no process group (``tp_group`` is only stored), and on a
CPU-only torch SGLang's ``device_module`` is ``torch.cpu`` (streams and events
exist there; timing is disabled). The one stand-in is the device-token
allocator: it returns the device indices each test chooses and records the
transfer-done events, the two calls the controller makes of it.

Expectations are computed from a clone of the device pool taken before any
transfer, never from our pools.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.errors import IndexOutOfRangeError, PoolMismatchError, UnsupportedLayoutError
from sgl_core.integrations.sglang import SGLangHostPool, wrap_host_pool

from sglang.srt.managers.cache_controller import HiCacheController  # isort: skip
from sglang.srt.mem_cache.l2_transfer import L2Transfer, L2TransferEngine  # isort: skip
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool  # isort: skip

PAGE = 4
LAYERS = 3
RANK, ROPE = 8, 4

CASES = [
    ("torch", "layer_first", "direct"),
    ("torch", "layer_first", "kernel"),
    ("torch", "page_first", "kernel"),  # SGLang runs page_first only with "kernel"
    ("torch", "page_first_direct", "direct"),
    ("cuda", "layer_first", "kernel"),
    ("cuda", "layer_first", "direct"),
    ("cuda", "page_first", "kernel"),
    ("cuda", "page_first_direct", "direct"),
]


class _Allocator:
    """The two calls HiCacheController makes of SGLang's token allocator."""

    def __init__(self, kvcache: Any) -> None:
        self.kvcache = kvcache
        self.next: list[torch.Tensor] = []
        self.events: dict[object, object] = {}

    def get_kvcache(self) -> Any:
        return self.kvcache

    def alloc(self, need: int) -> torch.Tensor:
        out = self.next.pop(0)
        assert out.numel() == need
        return out

    def set_hicache_transfer_done_event(self, key: object, event: object) -> None:
        self.events[key] = event


def _device_pool(seed: int = 0) -> MLATokenToKVPool:
    pool = MLATokenToKVPool(
        size=64,
        page_size=PAGE,
        dtype=torch.bfloat16,
        kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
    )
    gen = torch.Generator().manual_seed(seed)
    for layer in pool.kv_buffer:
        layer.copy_(torch.randn(layer.shape, generator=gen).to(layer.dtype))
    return pool


def _controller(dev: MLATokenToKVPool, host: SGLangHostPool, io: str) -> tuple[Any, _Allocator]:
    alloc = _Allocator(dev)
    ctl = HiCacheController(
        alloc,
        host,
        page_size=PAGE,
        tp_group=None,
        load_cache_event=threading.Event(),
        io_backend=io,
    )
    return ctl, alloc


def _expected_flat_page(rows: list[torch.Tensor], layout: str) -> torch.Tensor:
    """SGLang's flat page bytes of one page, from per-layer ``(PAGE, 1, dim)`` rows."""
    stacked = torch.stack(rows)  # (layer, token, 1, dim)
    if layout == "page_first":
        stacked = stacked.transpose(0, 1)  # token-major: (token, layer, 1, dim)
    return stacked.flatten()


@pytest.mark.parametrize(("backend_name", "layout", "io"), CASES)
def test_controller_write_load_roundtrip(backend_name: str, layout: str, io: str) -> None:
    dev = _device_pool()
    before = [layer.clone() for layer in dev.kv_buffer]
    backend = sgl_core.get_backend(backend_name)
    host = wrap_host_pool(backend.create_host_pool(dev, layout=layout))  # pin_memory=None
    ctl, alloc = _controller(dev, host, io)

    # Two writes (pages out of device order), each backed up at once.
    src_a = torch.arange(8, 16)
    src_b = torch.tensor([44, 45, 46, 47])
    host_a = ctl.write(src_a, node_id=1)
    host_b = ctl.write(src_b, node_id=2)
    assert host_a is not None and host_b is not None
    assert len(ctl.ack_write_queue) == 2
    ack = ctl.ack_write_queue[-1]
    assert ack.num_bytes == 4 * (RANK + ROPE) * 2 * LAYERS  # SGLang's size_per_token

    # The host bytes are SGLang's flat pages of the source rows.
    for h_idx, src in ((host_a, src_a), (host_b, src_b)):
        for p in range(len(src) // PAGE):
            tok = src[p * PAGE : (p + 1) * PAGE]
            want = _expected_flat_page([layer[tok] for layer in before], layout)
            got = host.get_data_page(h_idx[p * PAGE])  # a 0-d tensor, as SGLang passes
            assert torch.equal(got, want)

    # Two loads merged into one start_loading: host pages back to other device pages.
    dst_a = torch.arange(20, 28)
    dst_b = torch.arange(52, 56)
    alloc.next = [dst_a, dst_b]
    assert torch.equal(ctl.load(host_a, node_id=3), dst_a)
    assert torch.equal(ctl.load(host_b, node_id=4), dst_b)
    producer = ctl.start_loading()
    assert producer >= 0 and len(ctl.ack_load_queue) == 1
    assert set(alloc.events) == {(id(ctl), "write"), (id(ctl), "load")}

    for layer_id in range(LAYERS):
        want = before[layer_id].clone()
        want[dst_a] = before[layer_id][src_a]
        want[dst_b] = before[layer_id][src_b]
        assert torch.equal(dev.kv_buffer[layer_id], want), layer_id

    ctl.evict_host(torch.cat([host_a, host_b]))
    assert host.available_size() == host.size


def _cause(exc: BaseException) -> BaseException:
    """The transfer's own error: on CPU, SGLang's error handler then fails itself.

    ``L2TransferEngine`` calls ``stream.synchronize()`` when a transfer raises,
    and ``torch.cpu.Stream`` has no ``synchronize``: the AttributeError carries
    the original error as its ``__context__``.
    """
    if isinstance(exc, AttributeError) and exc.__context__ is not None:
        return exc.__context__
    return exc


@pytest.mark.parametrize("backend_name", ["torch", "cuda"])
def test_engine_rejects_bad_indices_and_changes_nothing(backend_name: str) -> None:
    """SGLang does not validate; our pool does, before any byte moves."""
    dev = _device_pool(1)
    backend = sgl_core.get_backend(backend_name)
    host = wrap_host_pool(backend.create_host_pool(dev, layout="layer_first"))
    engine = L2TransferEngine("kernel")
    h_idx = host.alloc(2 * PAGE)
    assert h_idx is not None
    engine.submit_device_to_host([L2Transfer(host, dev, h_idx, torch.arange(4, 12))])
    before = [layer.clone() for layer in dev.kv_buffer]

    bad_device = torch.tensor([4, 5, 6, 7, 8, 9, 10, 10_000])
    with pytest.raises(Exception) as info:
        engine.submit_host_to_device(
            [L2Transfer(host, dev, h_idx, bad_device)], transfer_layer_id_max=LAYERS
        )
    assert isinstance(_cause(info.value), IndexOutOfRangeError)
    with pytest.raises(Exception) as info:
        engine.submit_host_to_device(
            [L2Transfer(host, dev, h_idx, torch.arange(16, 24), is_draft=True)],
            transfer_layer_id_max=LAYERS,
        )
    assert isinstance(_cause(info.value), PoolMismatchError)
    assert "draft" in str(_cause(info.value))
    for layer, old in zip(dev.kv_buffer, before, strict=True):
        assert torch.equal(layer, old)


def test_torch_backend_refuses_an_unknown_io_name() -> None:
    dev = _device_pool(2)
    host = wrap_host_pool(sgl_core.get_backend("torch").create_host_pool(dev, layout="page_first"))
    h_idx = host.alloc(PAGE)
    assert h_idx is not None
    with pytest.raises(UnsupportedLayoutError):
        host.backup_from_device_all_layer(dev, h_idx, torch.arange(4, 8), "kernel_ascend")
    with pytest.raises(UnsupportedLayoutError):
        host.backup_from_device_all_layer(dev, h_idx, torch.arange(4, 8), "warp")


def test_ascend_pool_through_the_transfer_engine() -> None:
    """The ascend backend's pools (CPU tensors) under SGLang's L2TransferEngine."""
    backend = sgl_core.get_backend("ascend")
    dev = backend.create_device_pool(
        size=32, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE, layer_num=LAYERS,
    )  # fmt: skip
    src, dst = torch.arange(4, 12), torch.arange(20, 28)
    gen = torch.Generator().manual_seed(3)
    for layer_id in range(LAYERS):
        dev.set_mla_kv_buffer(
            layer_id,
            src,
            torch.randn(8, 1, RANK, generator=gen).bfloat16(),
            torch.randn(8, 1, ROPE, generator=gen).bfloat16(),
        )
    expected = [dev.get_mla_kv_buffer(i, src) for i in range(LAYERS)]
    layout = next(iter(backend.supported_pairs))
    io = backend.default_io(layout)
    host = wrap_host_pool(backend.create_host_pool(dev, layout=layout))
    assert host.storage_format_tag == f"sgl-{layout.value}"  # not SGLang's page bytes
    engine = L2TransferEngine(io.value)
    h_idx = host.alloc(8)
    assert h_idx is not None
    engine.submit_device_to_host([L2Transfer(host, dev, h_idx, src)])
    engine.submit_host_to_device([L2Transfer(host, dev, h_idx, dst)], transfer_layer_id_max=LAYERS)
    for layer_id in range(LAYERS):
        got = dev.get_mla_kv_buffer(layer_id, dst)
        assert all(torch.equal(a, b) for a, b in zip(got, expected[layer_id], strict=True))
