"""The engine-facing adapters that need no engine: device-pool view, aligned
host buffers, SGLang page keys' argument checks (SGLang itself: tests/with_sglang)."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch

import sgl_core
from sgl_core.errors import ArgumentTypeError, PoolMismatchError
from sgl_core.integrations.sglang import wrap_host_pool
from sgl_core.kv._memory import page_aligned_zeros, should_pin
from sgl_core.kv.device._engine_views import as_device_pool
from sgl_core.kv.device._foreign_pool import ForeignMLADevicePool
from sgl_core.l3 import page_keys


class _EnginePool:
    """The members of SGLang's MLATokenToKVPool our host pools read."""

    def __init__(self) -> None:
        self.size, self.page_size, self.layer_num = 32, 4, 2
        self.kv_lora_rank, self.qk_rope_head_dim, self.kv_cache_dim = 8, 4, 12
        self.dtype = torch.bfloat16
        self.device = "cpu"  # a str, as in SGLang
        gen = torch.Generator().manual_seed(0)
        self.kv_buffer = [
            torch.randn(36, 1, 12, generator=gen).bfloat16() for _ in range(self.layer_num)
        ]


@pytest.mark.parametrize("shape", [(3, 5), (1,), (0, 4), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
def test_page_aligned_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    t = page_aligned_zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % 4096 == 0
    assert not t.any()


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_host_buffers_are_page_aligned(layout: str) -> None:
    backend = sgl_core.get_backend("torch")
    dev = backend.create_device_pool(
        size=32, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4,
        layer_num=2,
    )  # fmt: skip
    host = backend.create_host_pool(dev, layout=layout)
    ptrs, _ = host.get_page_buffer_meta(torch.arange(host.size))
    assert ptrs[0] % 4096 == 0


def test_should_pin_takes_device_strings() -> None:
    assert should_pin(None, "cpu") is False
    assert should_pin(None, torch.device("cpu")) is False


def test_engine_pool_view_and_transfers() -> None:
    pool = _EnginePool()
    view = as_device_pool(pool)
    assert isinstance(view, ForeignMLADevicePool)
    assert as_device_pool(pool) is view  # cached: the load memo compares identity
    assert view.device == torch.device("cpu") and view.kv_buffer is pool.kv_buffer
    native = sgl_core.get_backend("torch").create_device_pool(
        size=32, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4,
        layer_num=2,
    )  # fmt: skip
    assert as_device_pool(native) is native

    host = wrap_host_pool(sgl_core.get_backend("torch").create_host_pool(pool, layout="page_first"))
    src, dst = torch.arange(4, 12), torch.arange(20, 28)
    before = [layer.clone() for layer in pool.kv_buffer]
    h_idx = host.alloc(8)
    assert h_idx is not None
    host.backup_from_device_all_layer(pool, h_idx, src, "kernel")
    for layer in range(2):
        host.load_to_device_per_layer(pool, h_idx, dst, layer, "kernel")
    for layer in range(2):
        want = before[layer].clone()
        want[dst] = before[layer][src]
        assert torch.equal(pool.kv_buffer[layer], want)
    nope, rope = view.get_mla_kv_buffer(1, dst)
    assert torch.equal(torch.cat([nope, rope], -1), before[1][src])
    view.set_mla_kv_buffer(0, torch.tensor([1]), nope[:1], rope[:1])
    assert torch.equal(pool.kv_buffer[0][1], before[1][src][0])
    with pytest.raises(PoolMismatchError):
        view.get_mla_kv_buffer(2, dst)


def test_engine_pool_without_layers_is_rejected() -> None:
    pool = _EnginePool()
    pool.kv_buffer = []
    with pytest.raises(PoolMismatchError):
        as_device_pool(pool)
    del pool.kv_buffer
    with pytest.raises(PoolMismatchError):
        as_device_pool(pool)
    pool = _EnginePool()
    pool.device = "no-such-device"
    with pytest.raises(PoolMismatchError):
        as_device_pool(pool)
    view = as_device_pool(_EnginePool())
    with pytest.raises(PoolMismatchError):
        view.get_mla_kv_buffer(True, torch.tensor([1]))  # type: ignore[arg-type]


def test_wrapper_checks_its_own_arguments() -> None:
    host = wrap_host_pool(
        sgl_core.get_backend("torch").create_host_pool(_EnginePool(), layout="layer_first")
    )
    with pytest.raises(ArgumentTypeError):
        host.is_stride_page_aligned(True)
    with pytest.raises(ArgumentTypeError):
        host.get_data_page(torch.tensor(0.0))
    assert torch.equal(host.get_data_page(torch.tensor(4)), host.get_data_page(4))


def test_sglang_keys_by_definition() -> None:
    """An independent statement of SGLang's hash; tests/with_sglang checks SGLang's code."""
    tokens = [1, 2, 3, 2**40]
    first = hashlib.sha256(struct.pack("<2I", 1, 2)).digest()
    second = hashlib.sha256(first + b"\xff" + struct.pack("<2Q", 3, 2**40)).digest()
    assert page_keys(tokens, 2, scheme="sglang") == [first.hex(), second.hex()]
    assert page_keys(tokens[2:], 2, first.hex(), scheme="sglang") == [second.hex()]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scheme": "sglang", "namespace": "model/"},
        {"scheme": "sglang", "prior_key": "abc"},
        {"scheme": "sglang", "prior_key": "zz" * 32},
        {"scheme": "other"},
    ],
)
def test_sglang_keys_reject_bad_arguments(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        page_keys([1, 2, 3, 4], 2, **kwargs)  # type: ignore[arg-type]


def test_sglang_keys_reject_negative_tokens() -> None:
    with pytest.raises(ValueError):
        page_keys([1, -2], 2, scheme="sglang")
