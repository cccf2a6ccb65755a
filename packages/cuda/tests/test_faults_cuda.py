"""Fault and abuse tests of the cuda backend (CPU tensors under TRITON_INTERPRET=1 here).

A device layer changed in place after a load was validated (``Tensor.set_``,
``sync_data_ptrs``) is validated again before the ``kernel`` io writes; two
threads transfer through one pool; bad devices and MoE routing are typed errors.
"""

from __future__ import annotations

import threading

import pytest
import torch

from sgl_core import errors
from sgl_core.testing import device_rows, fill_device_random, host_bytes, page_indices
from sgl_cuda import CudaMLADevicePool, CudaMLAHostPool, backend
from sgl_cuda.quantization import GGMLExpertBank, GGMLMoEMethod, GGMLQuantType

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PS = 4
PAGES = 6
LAYERS = 3
DIM = 24  # 16 + 8


def pools(layout: str, seed: int = 0) -> tuple[CudaMLADevicePool, CudaMLAHostPool]:
    dev = backend.create_device_pool(
        size=PAGES * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
    )
    fill_device_random(dev, seed)
    host = backend.create_host_pool(dev, layout=layout)
    idx = page_indices(list(range(PAGES)), PS)
    host.backup_from_device_all_layer(dev, idx, idx, "kernel")
    return dev, host


def snapshot(host: CudaMLAHostPool, *tensors: torch.Tensor) -> list[torch.Tensor]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return host_bytes(host) + [t.view(torch.uint8).cpu() for t in tensors]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


KERNEL_LAYOUTS = ["layer_first", "page_first"]


@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_kernel_load_into_a_layer_shrunk_with_set_is_rejected(layout: str) -> None:
    """Today's bug: the memo skipped validation and the kernel wrote past the layer's end."""
    dev, host = pools(layout)
    h_idx, d_idx = page_indices([0, 1], PS), page_indices([PAGES - 1, PAGES], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "kernel")  # validated, memo armed
    # The new layer is the first 2 pages of a guard as big as the old layer, so a
    # write past its end lands in the guard (detectable) rather than in freed memory.
    guard = torch.zeros((PAGES + 1) * PS, 1, DIM, dtype=torch.bfloat16, device=DEVICE)
    dev.kv_buffer[1].set_(guard.untyped_storage(), 0, (2 * PS, 1, DIM), (DIM, DIM, 1))
    before = snapshot(host, guard)
    with pytest.raises(errors.PoolMismatchError, match=r"kv_buffer\[1\]"):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "kernel")
    assert same(before, snapshot(host, guard)), "bytes written outside the layer"


@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_kernel_load_into_a_strided_layer_is_rejected(layout: str) -> None:
    """Same shape, every other row of a taller buffer: the kernel assumes dense rows."""
    dev, host = pools(layout, seed=1)
    h_idx, d_idx = page_indices([2, 3], PS), page_indices([1, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "kernel")
    rows = (PAGES + 1) * PS
    tall = torch.zeros(2 * rows, 1, DIM, dtype=torch.bfloat16, device=DEVICE)
    dev.kv_buffer[2].set_(tall.untyped_storage(), 0, (rows, 1, DIM), (2 * DIM, DIM, 1))
    before = snapshot(host, tall)
    with pytest.raises(errors.PoolMismatchError, match="contiguous"):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 2, "kernel")
    assert same(before, snapshot(host, tall))


@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_layer_moved_and_synced_is_written_at_its_new_place(layout: str) -> None:
    dev, host = pools(layout, seed=2)
    h_idx, d_idx = page_indices([5, 0], PS), page_indices([3, 2], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "kernel")
    fresh = torch.zeros_like(dev.kv_buffer[1])
    dev.kv_buffer[1].set_(fresh)
    dev.sync_data_ptrs()
    host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "kernel")
    ref = backend.create_device_pool(
        size=PAGES * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
    )
    host.load_to_device_per_layer(ref, h_idx, d_idx, 1, "kernel")
    assert torch.equal(device_rows(dev, 1, d_idx), device_rows(ref, 1, d_idx))
    assert int(dev.data_ptrs[1]) == fresh.data_ptr()


@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_kernel_transfers_from_four_threads(layout: str) -> None:
    """Interpreted launches are serialized; results are those of one thread."""
    dev, host = pools(layout, seed=3)
    jobs = [(page_indices([p], PS), page_indices([p + 1], PS)) for p in range(4)]
    failures: list[BaseException] = []
    start = threading.Barrier(len(jobs))

    def work(h_idx: torch.Tensor, d_idx: torch.Tensor) -> None:
        try:
            start.wait()
            for _ in range(3):
                host.backup_from_device_all_layer(dev, h_idx + 6 * PS, d_idx, "kernel")
                for layer in range(LAYERS):
                    host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "kernel")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    host.synchronize()
    # threads touch disjoint pages: each device page d holds host page h
    ref_dev = backend.create_device_pool(
        size=PAGES * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
    )
    for h_idx, d_idx in jobs:
        for layer in range(LAYERS):
            host.load_to_device_per_layer(ref_dev, h_idx, d_idx, layer, "kernel")
            assert torch.equal(device_rows(dev, layer, d_idx), device_rows(ref_dev, layer, d_idx))


@pytest.mark.parametrize("device", ["bogus", 0, "meta", torch.device("meta")])
def test_device_arguments_are_typed_errors(device: object) -> None:
    with pytest.raises(errors.DeviceError):
        backend.create_device_pool(
            size=PS,
            page_size=PS,
            dtype=torch.bfloat16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            layer_num=1,
            device=device,  # type: ignore[arg-type]
        )


def test_ggml_uses_the_shared_routing_check() -> None:
    q = GGMLQuantType.Q8_0  # blocks of 32 values in 34 bytes; zero bytes are valid blocks
    e, hidden, inter = 2, 32, 32
    gate_up = torch.zeros(e, 2 * inter, hidden // 32 * 34, dtype=torch.uint8)
    down = torch.zeros(e, hidden, inter // 32 * 34, dtype=torch.uint8)
    bank = GGMLExpertBank(gate_up, q, down, q).to(DEVICE)
    ids = torch.tensor([[0], [1], [0]], dtype=torch.int32, device=DEVICE)
    weights = torch.ones(3, 1, device=DEVICE)
    x = torch.zeros(3, hidden, device=DEVICE)
    method = GGMLMoEMethod()
    with pytest.raises(errors.IndexOutOfRangeError):
        method.apply(bank, x, weights, torch.full_like(ids, e))
    with pytest.raises(errors.IndexDTypeError):
        method.apply(bank, x, weights, ids.float())
    with pytest.raises(errors.ShapeMismatchError):
        method.apply(bank, x[:, :16], weights, ids)
    assert method.apply(bank, x[:0], weights[:0], ids[:0]).shape == (0, hidden)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", KERNEL_LAYOUTS)
def test_per_layer_loads_of_gpu_indices_do_not_synchronize(layout: str) -> None:
    """With indices on the GPU only the first layer of a batch may synchronize (validation)."""
    dev, host = pools(layout, seed=4)
    h_idx = page_indices([3, 0, 4], PS).to(DEVICE)
    d_idx = page_indices([1, 6, 2], PS).to(DEVICE)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "kernel")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for layer in range(1, LAYERS):
            host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "kernel")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    host.synchronize()
    ref = backend.create_device_pool(
        size=PAGES * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
    )
    for layer in range(LAYERS):
        host.load_to_device_per_layer(ref, h_idx.cpu(), d_idx.cpu(), layer, "kernel")
        assert torch.equal(
            device_rows(dev, layer, d_idx.cpu()), device_rows(ref, layer, d_idx.cpu())
        )
