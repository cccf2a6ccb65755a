"""Fault and abuse tests of the ascend backend: in-place buffer changes, devices, MoE edges."""

from __future__ import annotations

import pytest
import torch

import sgl_ascend
from sgl_ascend import (
    AscendMLADevicePool,
    AscendMLAHostPool,
    AscendMoEMethod,
    AscendW8A8DynamicMoEMethod,
    W8A8MoEWeights,
)
from sgl_ascend._backend import AscendBackend
from sgl_core import MoEWeights, errors
from sgl_core.backend import NEVER, CopyTuning
from sgl_core.testing import page_indices, random_bits

PS = 4
PAGES = 6
LAYERS = 3
IO = "kernel_ascend"


def pools(
    seed: int = 0, tuning: CopyTuning | None = None
) -> tuple[AscendMLADevicePool, AscendMLAHostPool]:
    dev = sgl_ascend.backend.create_device_pool(
        size=PAGES * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
    )
    gen = torch.Generator().manual_seed(seed)
    for buf in dev.components:
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))
    host = AscendBackend(tuning=tuning).create_host_pool(dev, layout="page_first_kv_split")
    idx = page_indices(list(range(PAGES)), PS)
    host.backup_from_device_all_layer(dev, idx, idx, IO)
    return dev, host


def state(host: AscendMLAHostPool, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.contiguous().view(torch.uint8).clone() for t in (*host.buffers, *tensors)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(params=["runs", "by_address"])
def copy_path(request: pytest.FixtureRequest) -> CopyTuning:
    """The per-row load path, chosen by the tuning object the pools are built with."""
    by_address = 0 if request.param == "by_address" else NEVER
    return CopyTuning(by_address_min_block_bytes=by_address)


def test_buffer_shrunk_with_set_after_validation_is_rejected(copy_path: CopyTuning) -> None:
    dev, host = pools(tuning=copy_path)
    h_idx, d_idx = page_indices([0, 1], PS), page_indices([PAGES - 1, PAGES], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, IO)  # validated, memo armed
    shape = tuple(dev.k_buffer.shape)
    guard = torch.zeros(shape, dtype=dev.k_buffer.dtype)
    small = (shape[0], 2, *shape[2:])  # two pages per layer: the indices' pages are gone
    dev.k_buffer.set_(guard.untyped_storage(), 0, small, torch.zeros(small).stride())
    before = state(host, guard, dev.v_buffer)
    with pytest.raises(errors.PoolMismatchError, match="k_buffer"):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, IO)
    assert same(before, state(host, guard, dev.v_buffer))


def test_replaced_buffer_of_wrong_shape_is_rejected_before_the_first_load(
    copy_path: CopyTuning,
) -> None:
    dev, host = pools(tuning=copy_path)
    dev.v_buffer = torch.zeros(LAYERS, 2, PS, 1, 8, dtype=torch.bfloat16)
    idx = page_indices([PAGES], PS)
    before = state(host, dev.k_buffer, dev.v_buffer)
    with pytest.raises(errors.PoolMismatchError, match="v_buffer"):
        host.load_to_device_per_layer(dev, idx, idx, 0, IO)
    with pytest.raises(errors.PoolMismatchError, match="v_buffer"):
        host.backup_from_device_all_layer(dev, idx, idx, IO)
    assert same(before, state(host, dev.k_buffer, dev.v_buffer))


def test_buffer_moved_with_set_is_written_at_its_new_place(copy_path: CopyTuning) -> None:
    dev, host = pools(seed=2, tuning=copy_path)
    h_idx, d_idx = page_indices([3, 1], PS), page_indices([2, 5], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, IO)
    fresh = torch.zeros_like(dev.k_buffer)
    dev.k_buffer.set_(fresh)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 1, IO)
    assert torch.equal(
        fresh[1, [2, 5]].view(torch.uint8), host.k_buffer[[3, 1], 1].view(torch.uint8)
    )


@pytest.mark.parametrize("device", ["bogus", 0, "meta", torch.device("meta")])
def test_device_arguments_are_typed_errors(device: object) -> None:
    with pytest.raises(errors.DeviceError):
        sgl_ascend.backend.create_device_pool(
            size=PS,
            page_size=PS,
            dtype=torch.bfloat16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            layer_num=1,
            device=device,  # type: ignore[arg-type]
        )


def test_meta_loc_is_a_device_error() -> None:
    dev, host = pools()
    meta = page_indices([1], PS).to("meta")
    before = state(host, dev.k_buffer, dev.v_buffer)
    with pytest.raises(errors.DeviceError):
        dev.get_mla_kv_buffer(0, meta)
    with pytest.raises(errors.DeviceError):
        host.load_to_device_per_layer(dev, meta, page_indices([1], PS), 0, IO)
    assert same(before, state(host, dev.k_buffer, dev.v_buffer))


# ----------------------------------------------------------------------- MoE
E, H, INTER, T, K = 4, 32, 16, 5, 2


def moe_problem() -> tuple[MoEWeights, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    layer = MoEWeights(
        torch.randn(E, 2 * INTER, H, generator=gen), torch.randn(E, H, INTER, generator=gen)
    )
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    return layer, torch.randn(T, H, generator=gen), torch.rand(T, K, generator=gen), ids


def methods() -> list[tuple[object, object]]:
    layer = moe_problem()[0]
    return [
        (AscendMoEMethod(), layer),
        (AscendW8A8DynamicMoEMethod(), W8A8MoEWeights.quantize(layer)),
    ]


@pytest.mark.parametrize("which", [0, 1])
def test_moe_empty_batch_returns_zero_rows(which: int) -> None:
    method, layer = methods()[which]
    _, x, w, ids = moe_problem()
    out = method.apply(layer, x[:0], w[:0], ids[:0])  # type: ignore[attr-defined]
    assert out.shape == (0, H) and out.dtype == x.dtype


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("float ids", errors.IndexDTypeError),
        ("hidden mismatch", errors.ShapeMismatchError),
        ("id == experts", errors.IndexOutOfRangeError),
    ],
)
def test_moe_bad_routing_is_a_typed_error(which: int, case: str, error: type[Exception]) -> None:
    method, layer = methods()[which]
    _, x, w, ids = moe_problem()
    args = {
        "float ids": (x, w, ids.float()),
        "hidden mismatch": (x[:, :-8], w, ids),
        "id == experts": (x, w, torch.where(ids == 0, E, ids)),
    }[case]
    with pytest.raises(error):
        method.apply(layer, *args)  # type: ignore[attr-defined]
