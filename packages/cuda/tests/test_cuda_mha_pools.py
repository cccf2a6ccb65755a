"""CUDA MHA pools: pointer tables, kernel io against the torch backend's bytes, launches, checks.

The reference for every ``kernel`` transfer is the torch backend's MHA host
pool of the same layout moved by the core ``direct`` mover (separate code):
after the same backup both host buffers must be byte-identical, and a load
must restore exactly the backed-up rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core.errors import BackendUnavailableError, PoolMismatchError, UnsupportedLayoutError
from sgl_cuda import CudaMHADevicePool, CudaMHAHostPool, _kv_checks, _movers, backend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PS, LAYERS, HEADS, DIM = 4, 3, 2, 8


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def fill(pool: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for layers in (pool.k_buffer, pool.v_buffer):
        for t in layers:
            bits = torch.randint(0, 256, (t.numel() * t.element_size(),), generator=gen)
            t.view(torch.uint8).view(-1).copy_(bits.to(torch.uint8))


def make_device(which: sgl_core.Backend, v_head_dim: int, seed: int = 0) -> Any:
    pool = which.create_mha_device_pool(
        size=6 * PS, page_size=PS, dtype=torch.bfloat16, head_num=HEADS, head_dim=DIM,
        layer_num=LAYERS, device=DEVICE if which is backend else "cpu", v_head_dim=v_head_dim,
    )  # fmt: skip
    fill(pool, seed)
    return pool


def shuffled_pages(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(host, device) token indices: 3 shuffled whole pages each (device page 0 is padding)."""
    gen = torch.Generator().manual_seed(seed)
    host_pages = torch.randperm(10, generator=gen)[:3]
    dev_pages = torch.randperm(6, generator=gen)[:3] + 1
    host = (host_pages[:, None] * PS + torch.arange(PS)).flatten()
    dev = (dev_pages[:, None] * PS + torch.arange(PS)).flatten()
    return host, dev


# ----------------------------------------------------------------- device pool
def test_device_pool_layers_and_tables() -> None:
    pool = backend.create_mha_device_pool(
        size=2 * PS, page_size=PS, dtype=torch.float16, head_num=HEADS, head_dim=DIM,
        layer_num=LAYERS, v_head_dim=4,
    )  # fmt: skip
    assert isinstance(pool, CudaMHADevicePool)
    assert isinstance(pool, sgl_core.MHADevicePool)
    assert [tuple(t.shape) for t in pool.k_buffer] == [(3 * PS, HEADS, DIM)] * LAYERS
    assert [tuple(t.shape) for t in pool.v_buffer] == [(3 * PS, HEADS, 4)] * LAYERS
    ptrs = [t.data_ptr() for t in (*pool.k_buffer, *pool.v_buffer)]
    assert len(set(ptrs)) == 2 * LAYERS  # one allocation per layer and component
    for table, layers in ((pool.k_data_ptrs, pool.k_buffer), (pool.v_data_ptrs, pool.v_buffer)):
        assert table.dtype == torch.uint64
        assert table.device == pool.device
        assert table.cpu().tolist() == [t.data_ptr() for t in layers]


def test_tables_follow_replaced_layers_in_place() -> None:
    pool = backend.create_mha_device_pool(
        size=PS, page_size=PS, dtype=torch.float16, head_num=1, head_dim=4, layer_num=2
    )
    assert isinstance(pool, CudaMHADevicePool)
    k_table, v_table = pool.k_data_ptrs, pool.v_data_ptrs
    pool.v_buffer[1] = torch.ones(2 * PS, 1, 4, dtype=torch.float16, device=pool.device)
    assert pool.v_data_ptrs is v_table  # updated in place: holders of the table stay valid
    assert v_table.cpu().tolist() == [t.data_ptr() for t in pool.v_buffer]
    pool.k_buffer[0].data = torch.zeros(2 * PS, 1, 4, dtype=torch.float16, device=pool.device)
    assert pool.k_data_ptrs is k_table
    assert k_table.cpu().tolist() == [t.data_ptr() for t in pool.k_buffer]
    before = v_table.clone()
    pool.v_buffer[0] = torch.zeros(2 * PS, 1, 4, dtype=torch.bfloat16, device=pool.device)
    with pytest.raises(PoolMismatchError, match="v_buffer"):
        _ = pool.v_data_ptrs
    assert torch.equal(v_table, before)


# ------------------------------------------------------------------ host pool
def test_pairs_and_default_io() -> None:
    pairs = backend.supported_mha_pairs
    kernel, direct = sgl_core.IOBackend.KERNEL, sgl_core.IOBackend.DIRECT
    assert {k.value: v for k, v in pairs.items()} == {
        "layer_first": frozenset({kernel, direct}),
        "page_first": frozenset({kernel}),
        "page_first_direct": frozenset({direct}),
        "page_head": frozenset({kernel}),
    }
    assert [backend.default_mha_io(layout).value for layout in pairs] == [
        "kernel", "kernel", "direct", "kernel",
    ]  # fmt: skip


KERNEL_LAYOUTS = ["layer_first", "page_first", "page_head"]


@pytest.mark.parametrize("v_head_dim", [DIM, 4])
@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_kernel_bytes_match_the_torch_backend(layout: str, v_head_dim: int) -> None:
    torch_backend = sgl_core.get_backend("torch")
    dev = make_device(backend, v_head_dim, seed=1)
    ref_dev = make_device(torch_backend, v_head_dim, seed=1)
    host = backend.create_host_pool(dev, layout=layout, io_backend="kernel")
    ref = torch_backend.create_host_pool(ref_dev, layout=layout, io_backend="direct")
    assert isinstance(host, CudaMHAHostPool)
    h, d = shuffled_pages(seed=2)
    host.backup_from_device_all_layer(dev, h, d.to(DEVICE), "kernel")
    ref.backup_from_device_all_layer(ref_dev, h, d, "direct")
    host.synchronize()
    assert torch.equal(raw(host.k_buffer), raw(ref.k_buffer))
    assert torch.equal(raw(host.v_buffer), raw(ref.v_buffer))
    # load each layer into fresh slots of a zeroed pool: exactly those rows come back
    fresh = make_device(backend, v_head_dim, seed=3)
    for layers in (fresh.k_buffer, fresh.v_buffer):
        for t in layers:
            t.zero_()
    _, d2 = shuffled_pages(seed=4)
    for layer in range(LAYERS):
        host.load_to_device_per_layer(fresh, h, d2.to(DEVICE), layer, "kernel")
    host.synchronize()
    for src, dst in ((dev.k_buffer, fresh.k_buffer), (dev.v_buffer, fresh.v_buffer)):
        for layer in range(LAYERS):
            expected = torch.zeros_like(dst[layer])
            expected[d2.to(DEVICE)] = src[layer][d.to(DEVICE)]
            assert torch.equal(raw(dst[layer]), raw(expected))


@pytest.mark.parametrize(("v_head_dim", "launches"), [(DIM, 1), (4, 2)])
def test_one_launch_per_transfer(
    monkeypatch: pytest.MonkeyPatch, v_head_dim: int, launches: int
) -> None:
    """K and V together: one launch per backup and per layer load (two for unequal widths)."""
    calls: list[int] = []
    real = _kv_checks.bind_rows

    def counting(*args: Any, **kwargs: Any) -> tuple[Callable[..., None], bool]:
        launch, interpreted = real(*args, **kwargs)

        def counted(*idx: torch.Tensor) -> None:
            calls.append(1)
            launch(*idx)

        return counted, interpreted

    monkeypatch.setattr(_movers, "bind_rows", counting)
    dev = make_device(backend, v_head_dim)
    host = backend.create_host_pool(dev, layout="page_head")
    h, d = shuffled_pages(seed=5)
    host.backup_from_device_all_layer(dev, h, d.to(DEVICE), "kernel")
    assert len(calls) == launches
    host.load_to_device_per_layer(dev, h, d.to(DEVICE), 2, "kernel")
    assert len(calls) == 2 * launches


def test_foreign_per_layer_device_pool_with_kernel_io() -> None:
    """A torch-backend device pool (layers in one allocation): tables are built per call."""
    dev = make_device(sgl_core.get_backend("torch"), DIM, seed=6)
    if DEVICE.type == "cuda":
        pytest.skip("the torch backend's pool is on CPU; kernel io needs it on the GPU")
    host = backend.create_host_pool(dev, layout="layer_first", io_backend="kernel")
    h, d = shuffled_pages(seed=7)
    host.backup_from_device_all_layer(dev, h, d, "kernel")
    for layer in range(LAYERS):
        assert torch.equal(raw(host.k_buffer[layer][h]), raw(dev.k_buffer[layer][d]))
        assert torch.equal(raw(host.v_buffer[layer][h]), raw(dev.v_buffer[layer][d]))


def test_strided_device_layer_rejected_before_any_copy() -> None:
    dev = make_device(backend, DIM, seed=8)
    host = backend.create_host_pool(dev, layout="page_first", io_backend="kernel")
    h, d = shuffled_pages(seed=9)
    host.backup_from_device_all_layer(dev, h, d.to(DEVICE), "kernel")
    strided = torch.zeros(3 * 7 * PS, HEADS, DIM, dtype=torch.bfloat16, device=DEVICE)[::3]
    dev.v_buffer[1] = strided
    snapshot = [raw(t).clone() for t in (host.k_buffer, host.v_buffer, strided)]
    with pytest.raises(PoolMismatchError, match="contiguous"):
        host.load_to_device_per_layer(dev, h, d.to(DEVICE), 1, "kernel")
    with pytest.raises(PoolMismatchError, match="contiguous"):
        host.backup_from_device_all_layer(dev, h, d.to(DEVICE), "kernel")
    after = [raw(t) for t in (host.k_buffer, host.v_buffer, strided)]
    assert all(torch.equal(x, y) for x, y in zip(snapshot, after, strict=True))


def test_host_tables_address_each_layer_view() -> None:
    dev = make_device(backend, 4)
    for layout in ("layer_first", "page_first", "page_head"):
        host = backend.create_host_pool(dev, layout=layout)
        assert isinstance(host, CudaMHAHostPool)
        for table, buf in ((host.k_data_ptrs, host.k_buffer), (host.v_data_ptrs, host.v_buffer)):
            step = buf[0].numel() if layout == "layer_first" else buf.shape[-1] * HEADS
            if layout == "page_head":
                step = buf.shape[-1]
            expected = [buf.data_ptr() + i * step * buf.element_size() for i in range(LAYERS)]
            assert table.cpu().tolist() == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pinned memory)")
def test_kernel_only_layout_needs_pinned_memory() -> None:
    dev = make_device(backend, DIM)
    with pytest.raises(UnsupportedLayoutError, match="pinned"):
        backend.create_host_pool(dev, layout="page_head", pin_memory=False)


def test_tables_reject_a_changed_layer_count() -> None:
    pool = backend.create_mha_device_pool(
        size=PS, page_size=PS, dtype=torch.float16, head_num=1, head_dim=4, layer_num=2
    )
    assert isinstance(pool, CudaMHADevicePool)
    pool.k_buffer.append(torch.zeros(2 * PS, 1, 4, dtype=torch.float16, device=pool.device))
    with pytest.raises(PoolMismatchError, match="k_buffer must hold 2"):
        _ = pool.k_data_ptrs


def test_kernel_io_rejects_unusable_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU pools run the kernels only under the interpreter; nothing moves otherwise."""
    if DEVICE.type == "cuda":
        pytest.skip("CUDA pools are usable")
    from sgl_cuda._triton import kvcacheio as triton_kvcacheio

    dev = make_device(backend, DIM, seed=10)
    host = backend.create_host_pool(dev, layout="page_head")
    h, d = shuffled_pages(seed=11)
    before = raw(host.k_buffer).clone()
    monkeypatch.setattr(triton_kvcacheio, "INTERPRETED", False)
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET"):
        host.backup_from_device_all_layer(dev, h, d, "kernel")
    assert torch.equal(raw(host.k_buffer), before)
