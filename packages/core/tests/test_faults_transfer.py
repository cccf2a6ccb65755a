"""Fault and abuse tests of host-pool transfers (torch backend; cuda/ascend have their own).

Every rejected call must raise a typed ``sgl_core.errors`` exception and leave
every byte of both pools unchanged; a device layer changed in place after a
load was validated must be validated again before a byte moves.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core import errors
from sgl_core.testing import device_rows, fill_device_random, host_bytes, page_indices

PS = 16
PAGES = 6
LAYERS = 3


def device_pool(**overrides: object) -> sgl_core.backend.PerLayerMLADevicePool:
    args: dict[str, object] = {
        "size": PAGES * PS,
        "page_size": PS,
        "dtype": torch.bfloat16,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "layer_num": LAYERS,
    }
    args.update(overrides)
    return sgl_core.TorchBackend().create_device_pool(**args)  # type: ignore[arg-type]


def pools(
    layout: str, seed: int = 0
) -> tuple[sgl_core.backend.PerLayerMLADevicePool, sgl_core.backend.TokenRowHostPool]:
    dev = device_pool()
    fill_device_random(dev, seed)
    host = sgl_core.TorchBackend().create_host_pool(dev, layout=layout)
    idx = page_indices(list(range(PAGES)), PS)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    fill_device_random(dev, seed + 1)
    return dev, host


def raw_state(
    dev: sgl_core.backend.PerLayerMLADevicePool,
    host: sgl_core.backend.TokenRowHostPool,
    *extra: torch.Tensor,
) -> list[torch.Tensor]:
    """Bytes of every device layer tensor as it is now, the host pool and ``extra`` buffers."""
    layers = [t.contiguous().view(torch.uint8).clone() for t in dev.kv_buffer]
    return layers + host_bytes(host) + [t.view(torch.uint8).clone() for t in extra]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


# ------------------------------------------------- layer storage changed in place
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layer_shrunk_with_set_after_validation_is_rejected(layout: str) -> None:
    """``set_`` onto a smaller view of a guard buffer between two layers of one batch."""
    dev, host = pools(layout)
    h_idx, d_idx = page_indices([0, 1], PS), page_indices([PAGES - 1, PAGES], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")  # validated, memo armed
    layer = dev.kv_buffer[1]
    rows = 2 * PS  # the last pages the indices address are gone
    guard = torch.zeros((PAGES + 1) * PS, 1, 24, dtype=torch.bfloat16)
    layer.set_(guard.untyped_storage(), 0, (rows, 1, 24), (24, 24, 1))
    before = raw_state(dev, host, guard)
    with pytest.raises(errors.PoolMismatchError, match=r"kv_buffer\[1\]"):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    assert same(before, raw_state(dev, host, guard))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layer_moved_with_set_is_written_at_its_new_place(layout: str) -> None:
    """A layer moved to a new storage of the right shape: the load writes there, bit-exact."""
    dev, host = pools(layout, seed=3)
    h_idx, d_idx = page_indices([2, 3], PS), page_indices([1, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    fresh = torch.zeros_like(dev.kv_buffer[2])
    dev.kv_buffer[2].set_(fresh)
    # also strided: every other row of a buffer twice as tall
    tall = torch.zeros(2 * dev.kv_buffer[1].shape[0], 1, 24, dtype=torch.bfloat16)
    dev.kv_buffer[1].set_(tall.untyped_storage(), 0, tuple(dev.kv_buffer[1].shape), (48, 24, 1))
    for layer in (1, 2):
        host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "direct")
    ref = device_pool()  # loaded the ordinary way
    for layer in range(LAYERS):
        host.load_to_device_per_layer(ref, h_idx, d_idx, layer, "direct")
    for layer in (1, 2):
        assert torch.equal(device_rows(dev, layer, d_idx), device_rows(ref, layer, d_idx))
    assert fresh.view(torch.uint8).any() and tall[0::2].view(torch.uint8).any()
    assert not tall[1::2].view(torch.uint8).any(), "wrote between the rows of a strided layer"


def test_replaced_storage_too_small_is_rejected() -> None:
    dev, host = pools("layer_first")
    h_idx, d_idx = page_indices([0], PS), page_indices([PAGES], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    small = torch.zeros(PS, 1, 24, dtype=torch.bfloat16)
    dev.kv_buffer[2] = small  # a plain list: any object can be put there
    with pytest.raises(errors.PoolMismatchError):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 2, "direct")
    assert not small.view(torch.uint8).any()


# ------------------------------------------------------------ sizing arguments
BAD_SIZES: list[tuple[str, object, type[Exception]]] = [
    ("host_to_device_ratio", math.nan, errors.PoolSizeError),
    ("host_to_device_ratio", math.inf, errors.PoolSizeError),
    ("host_to_device_ratio", -1.0, errors.PoolSizeError),
    ("host_to_device_ratio", "2", errors.ArgumentTypeError),
    ("host_to_device_ratio", None, errors.ArgumentTypeError),
    ("host_to_device_ratio", True, errors.ArgumentTypeError),
    ("host_to_device_ratio", 1e300, errors.PoolSizeError),
    ("host_size_gb", math.nan, errors.PoolSizeError),
    ("host_size_gb", -math.inf, errors.PoolSizeError),
    ("host_size_gb", math.inf, errors.PoolSizeError),
    ("host_size_gb", "1", errors.ArgumentTypeError),
    ("host_size_gb", None, errors.ArgumentTypeError),
    ("host_size_gb", 1e9, errors.PoolSizeError),
]


@pytest.mark.parametrize(("name", "value", "error"), BAD_SIZES)
def test_host_sizing_arguments_are_typed_errors(
    name: str, value: object, error: type[Exception]
) -> None:
    dev = device_pool()
    for layout in LAYOUTS:
        with pytest.raises(error, match=name):
            sgl_core.TorchBackend().create_host_pool(dev, layout=layout, **{name: value})  # type: ignore[arg-type]


def test_device_pool_beyond_memory_is_a_pool_size_error() -> None:
    # about 1 PB: refused before any allocation is attempted
    with pytest.raises(errors.PoolSizeError, match="device pool"):
        device_pool(size=2**40, page_size=1, kv_lora_rank=512, qk_rope_head_dim=64, layer_num=1)


@pytest.mark.parametrize("device", ["bogus", "cuda:zero", 0, 1.5, "meta", torch.device("meta")])
def test_device_arguments_are_typed_errors(device: object) -> None:
    with pytest.raises(errors.DeviceError):
        device_pool(device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_is_backend_unavailable() -> None:
    with pytest.raises(errors.BackendUnavailableError):
        device_pool(device="cuda:0")


# -------------------------------------------------------- indices on a device
def meta_cases(
    dev: sgl_core.backend.PerLayerMLADevicePool, host: sgl_core.backend.TokenRowHostPool
) -> list[tuple[str, Callable[[], object]]]:
    good = page_indices([1, 2], PS)
    meta = good.to("meta")
    return [
        ("meta host_indices", lambda: host.backup_from_device_all_layer(dev, meta, good, "direct")),
        (
            "meta device_indices",
            lambda: host.load_to_device_per_layer(dev, good, meta, 0, "direct"),
        ),
        ("meta free", lambda: host.free(meta)),
        (
            "meta loc set",
            lambda: dev.set_mla_kv_buffer(0, meta, torch.zeros(32, 1, 16), torch.zeros(32, 1, 8)),
        ),
        ("meta loc get", lambda: dev.get_mla_kv_buffer(0, meta)),
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_index_tensors_on_meta_are_device_errors(layout: str) -> None:
    dev, host = pools(layout, seed=5)
    for name, call in meta_cases(dev, host):
        before = raw_state(dev, host)
        with pytest.raises(errors.DeviceError):
            call()
            pytest.fail(f"{name} accepted")
        assert same(before, raw_state(dev, host)), name


# ------------------------------------------------------------------- threads
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bad_calls_from_threads_change_nothing(layout: str) -> None:
    """Loaders with good indices run while other threads hammer the pool with bad ones."""
    dev, host = pools(layout, seed=7)
    ref = device_pool()
    h_idx, d_idx = page_indices([4, 0], PS), page_indices([2, 3], PS)
    nan_idx = torch.tensor([math.nan] * PS)
    bad: list[Callable[[], object]] = [
        lambda: host.load_to_device_per_layer(dev, h_idx, d_idx + 10**6, 1, "direct"),
        lambda: host.load_to_device_per_layer(dev, h_idx, nan_idx, 0, "direct"),  # type: ignore[arg-type]
        lambda: host.load_to_device_per_layer(dev, h_idx.to("meta"), d_idx, 2, "direct"),
        lambda: host.backup_from_device_all_layer(dev, h_idx, torch.cat([d_idx, d_idx]), "direct"),
        lambda: host.load_to_device_per_layer(dev, h_idx, d_idx, LAYERS, "direct"),
        lambda: host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "warp_drive"),
    ]
    failures: list[BaseException] = []
    start = threading.Barrier(3)

    def loader() -> None:
        try:
            start.wait()
            for _ in range(10):
                for layer in range(LAYERS):
                    host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "direct")
        except BaseException as exc:
            failures.append(exc)

    def abuser() -> None:
        try:
            start.wait()
            for _ in range(10):
                for call in bad:
                    try:
                        call()
                    except errors.SGLError:
                        continue
                    failures.append(AssertionError("a bad call was accepted"))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=loader), threading.Thread(target=abuser)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    assert not failures, failures
    for layer in range(LAYERS):
        host.load_to_device_per_layer(ref, h_idx, d_idx, layer, "direct")
        assert torch.equal(device_rows(dev, layer, d_idx), device_rows(ref, layer, d_idx))
