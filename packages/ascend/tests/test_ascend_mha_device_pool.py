"""The Ascend MHA / GQA device pool on CPU tensors: layout, token rows, bad arguments."""

from __future__ import annotations

import pytest
import torch

from sgl_ascend import AscendMHADevicePool
from sgl_core.errors import (
    ArgumentTypeError,
    BackendUnavailableError,
    DeviceError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    LayerIndexError,
    PoolMismatchError,
    PoolSizeError,
    ShapeMismatchError,
)
from sgl_core.testing import random_bits

PS = 4
LAYERS = 3
HEADS, DIM, VDIM = 2, 8, 6


def make_dev(
    *, pages: int = 5, dtype: torch.dtype = torch.bfloat16, v_head_dim: int | None = VDIM
) -> AscendMHADevicePool:
    return AscendMHADevicePool(
        size=pages * PS,
        page_size=PS,
        dtype=dtype,
        head_num=HEADS,
        head_dim=DIM,
        layer_num=LAYERS,
        v_head_dim=v_head_dim,
    )


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def snapshot(dev: AscendMHADevicePool) -> list[torch.Tensor]:
    return [dev.k_buffer.clone(), dev.v_buffer.clone()]


def unchanged(dev: AscendMHADevicePool, before: list[torch.Tensor]) -> bool:
    return all(same(a, b) for a, b in zip(before, snapshot(dev), strict=True))


def test_contiguous_layer_major_buffers() -> None:
    dev = make_dev()
    assert dev.page_num == 6
    assert dev.slot_count == 24
    assert dev.k_buffer.shape == (LAYERS, 6, PS, HEADS, DIM)
    assert dev.v_buffer.shape == (LAYERS, 6, PS, HEADS, VDIM)
    for buf in dev.components:
        assert buf.is_contiguous()
        assert buf.dtype == torch.bfloat16
        assert buf.device == torch.device("cpu")  # device=None without an NPU
    assert dev.components[0] is dev.k_buffer
    assert dev.components[1] is dev.v_buffer
    assert not hasattr(dev, "data_ptrs")
    assert not hasattr(dev, "kv_buffer")
    assert (dev.head_num, dev.head_dim, dev.v_head_dim, dev.layer_num) == (HEADS, DIM, VDIM, 3)
    assert dev.shape.layout_dim == LAYERS * HEADS * (DIM + VDIM) * 2
    assert dev.get_key_buffer(2).shape == (6, PS, HEADS, DIM)
    assert dev.get_value_buffer(2).data_ptr() == dev.v_buffer[2].data_ptr()
    assert [dev.indexer_slot(i) for i in range(LAYERS)] == [None] * LAYERS
    with pytest.raises(LayerIndexError):
        dev.indexer_slot(LAYERS)


def test_v_head_dim_defaults_to_head_dim() -> None:
    dev = make_dev(v_head_dim=None)
    assert dev.v_head_dim == DIM
    assert dev.v_buffer.shape == dev.k_buffer.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
def test_token_maps_to_page_and_offset(dtype: torch.dtype) -> None:
    dev = make_dev(dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    loc = torch.tensor([0, 5, 23, 13], dtype=torch.int64)  # 23: last slot of the padding page
    k = random_bits((4, HEADS, DIM), dtype, gen)
    v = random_bits((4, HEADS, VDIM), dtype, gen)
    dev.set_kv_buffer(1, loc, k, v)
    for i, t in enumerate(loc.tolist()):
        assert same(dev.k_buffer[1, t // PS, t % PS], k[i])
        assert same(dev.v_buffer[1, t // PS, t % PS], v[i])
    got_k, got_v = dev.get_kv_buffer(1, loc)
    assert got_k.dtype == got_v.dtype == dtype
    assert same(got_k, k)
    assert same(got_v, v)
    for layer in (0, 2):
        assert not dev.k_buffer[layer].view(torch.uint8).any()
        assert not dev.v_buffer[layer].view(torch.uint8).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16])
def test_rows_of_another_dtype_are_refused_not_converted(dtype: torch.dtype) -> None:
    dev = make_dev()
    dev.k_buffer.copy_(random_bits(tuple(dev.k_buffer.shape), dev.dtype, torch.Generator()))
    loc = torch.tensor([3, 4], dtype=torch.int64)
    k = torch.ones(2, HEADS, DIM, dtype=torch.bfloat16)
    v = torch.ones(2, HEADS, VDIM, dtype=torch.bfloat16)
    before = snapshot(dev)
    for args in ((k.to(dtype), v), (k, v.to(dtype))):
        with pytest.raises(ShapeMismatchError, match="not converted"):
            dev.set_kv_buffer(0, loc, *args)
        assert unchanged(dev, before)
    dev.set_kv_buffer(0, loc, k, 2 * v)  # the pool's dtype lands as given
    got_k, got_v = dev.get_kv_buffer(0, loc)
    assert torch.equal(got_k, k) and torch.equal(got_v, 2 * v)


def _rows(n: int, dim: int) -> torch.Tensor:
    return torch.ones(n, HEADS, dim, dtype=torch.bfloat16)


LOC = torch.tensor([4, 5], dtype=torch.int64)


@pytest.mark.parametrize(
    ("layer", "loc", "k", "v", "error"),
    [
        (3, LOC, _rows(2, DIM), _rows(2, VDIM), LayerIndexError),
        (True, LOC, _rows(2, DIM), _rows(2, VDIM), ArgumentTypeError),
        (0, LOC.int(), _rows(2, DIM), _rows(2, VDIM), IndexDTypeError),
        (0, LOC.view(1, 2), _rows(2, DIM), _rows(2, VDIM), IndexShapeError),
        (0, torch.tensor([24]), _rows(1, DIM), _rows(1, VDIM), IndexOutOfRangeError),
        (0, torch.tensor([-1]), _rows(1, DIM), _rows(1, VDIM), IndexOutOfRangeError),
        (0, LOC, _rows(3, DIM), _rows(2, VDIM), PoolMismatchError),
        (0, LOC, _rows(2, VDIM), _rows(2, VDIM), PoolMismatchError),
        (0, LOC, _rows(2, DIM), _rows(2, DIM), PoolMismatchError),
        (0, LOC, torch.ones(2, 1, DIM), _rows(2, VDIM), PoolMismatchError),
        (0, LOC, _rows(2, DIM), [[0.0]], ArgumentTypeError),
        (0, LOC, "k", _rows(2, VDIM), ArgumentTypeError),
    ],
)
def test_bad_rows_change_nothing(
    layer: object, loc: torch.Tensor, k: object, v: object, error: type[Exception]
) -> None:
    dev = make_dev()
    before = snapshot(dev)
    with pytest.raises(error):
        dev.set_kv_buffer(layer, loc, k, v)  # type: ignore[arg-type]
    assert unchanged(dev, before)


def test_get_checks_its_arguments() -> None:
    dev = make_dev()
    with pytest.raises(IndexOutOfRangeError):
        dev.get_kv_buffer(0, torch.tensor([24]))
    with pytest.raises(LayerIndexError):
        dev.get_kv_buffer(-1, LOC)
    with pytest.raises(IndexDTypeError):
        dev.get_kv_buffer(0, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(LayerIndexError):
        dev.get_key_buffer(LAYERS)
    with pytest.raises(LayerIndexError):
        dev.get_value_buffer(LAYERS)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"size": 6}, PoolSizeError),
        ({"size": 0}, PoolSizeError),
        ({"size": 8.0}, PoolSizeError),
        ({"page_size": 0}, PoolSizeError),
        ({"page_size": True}, PoolSizeError),
        ({"head_num": 0}, PoolSizeError),
        ({"head_dim": -2}, PoolSizeError),
        ({"layer_num": 0}, PoolSizeError),
        ({"v_head_dim": 0}, PoolSizeError),
        ({"v_head_dim": 2.0}, PoolSizeError),
        ({"dtype": "bfloat16"}, ArgumentTypeError),
        ({"size": 1 << 50, "page_size": 1 << 10}, PoolSizeError),  # beyond host memory
        ({"device": "meta"}, DeviceError),
        ({"device": 7}, DeviceError),
    ],
)
def test_bad_geometry(kwargs: dict[str, object], error: type[Exception]) -> None:
    args: dict[str, object] = {
        "size": 8,
        "page_size": PS,
        "dtype": torch.bfloat16,
        "head_num": HEADS,
        "head_dim": DIM,
        "layer_num": LAYERS,
        **kwargs,
    }
    with pytest.raises(error):
        AscendMHADevicePool(**args)  # type: ignore[arg-type]


def test_npu_without_torch_npu_says_what_to_install() -> None:
    with pytest.raises(BackendUnavailableError, match=r"pip install './packages/ascend\[npu\]'"):
        AscendMHADevicePool(
            size=8, page_size=PS, dtype=torch.bfloat16, head_num=1, head_dim=4, layer_num=1,
            device="npu:0",
        )  # fmt: skip
