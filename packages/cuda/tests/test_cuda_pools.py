"""CUDA pools: data_ptrs tables, host views, one launch per transfer, availability."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

import sgl_core
from sgl_core import Backend, HostLayout, IOBackend, MLADevicePool, MLAHostPool
from sgl_core.errors import BackendUnavailableError, PoolMismatchError, UnsupportedLayoutError
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_cuda import CudaBackend, CudaMLADevicePool, CudaMLAHostPool, backend
from sgl_cuda._triton import kvcacheio as triton_kvcacheio

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_pool(page_size: int = 4, pages: int = 3, layers: int = 3) -> CudaMLADevicePool:
    return backend.create_device_pool(
        size=pages * page_size,
        page_size=page_size,
        dtype=torch.bfloat16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        layer_num=layers,
    )


def table(pool_layers: list[torch.Tensor]) -> list[int]:
    return [t.data_ptr() for t in pool_layers]


# ----------------------------------------------------------------- device pool
def test_device_pool_layers_and_table() -> None:
    pool = make_pool()
    assert isinstance(pool, MLADevicePool)
    assert pool.device.type == DEVICE.type
    assert isinstance(pool.kv_buffer, list)
    assert len(pool.kv_buffer) == 3
    for layer in pool.kv_buffer:
        assert layer.shape == (16, 1, 12)
        assert layer.dtype == torch.bfloat16
    assert len(set(table(pool.kv_buffer))) == 3  # separate allocations
    assert pool.data_ptrs.dtype == torch.uint64
    assert pool.data_ptrs.device == pool.device
    assert pool.data_ptrs.cpu().tolist() == table(pool.kv_buffer)


def test_data_ptrs_follow_replaced_buffers() -> None:
    pool = make_pool()
    ptrs = pool.data_ptrs
    fresh = torch.ones(16, 1, 12, dtype=torch.bfloat16, device=pool.device)
    pool.set_kv_buffer(1, fresh)
    assert pool.kv_buffer[1] is fresh
    other = torch.full((16, 1, 12), 2.0, dtype=torch.bfloat16, device=pool.device)
    pool.kv_buffer[2] = other
    assert pool.kv_buffer[2] is other
    assert pool.data_ptrs is ptrs  # updated in place: holders of the table stay valid
    assert ptrs.cpu().tolist() == table(pool.kv_buffer)
    # storage swapped under the pool's feet: re-synced before use
    pool.kv_buffer[0].data = torch.zeros(16, 1, 12, dtype=torch.bfloat16, device=pool.device)
    assert pool.data_ptrs.cpu().tolist() == table(pool.kv_buffer)


def test_bad_buffer_replacement_rejected() -> None:
    pool = make_pool()
    before = table(pool.kv_buffer)
    with pytest.raises(PoolMismatchError):
        pool.set_kv_buffer(0, torch.zeros(15, 1, 12, dtype=torch.bfloat16, device=pool.device))
    with pytest.raises(PoolMismatchError):
        pool.kv_buffer[0] = torch.zeros(16, 1, 12, dtype=torch.float16, device=pool.device)
    with pytest.raises(TypeError):
        pool.kv_buffer.append(torch.zeros(16, 1, 12, dtype=torch.bfloat16))
    with pytest.raises(TypeError):
        del pool.kv_buffer[0]
    assert table(pool.kv_buffer) == before == pool.data_ptrs.cpu().tolist()


def test_set_get_mla_rows() -> None:
    pool = make_pool()
    loc = torch.tensor([3, 9], dtype=torch.int64)
    nope = torch.randn(2, 1, 8).to(torch.bfloat16)
    rope = torch.randn(2, 1, 4).to(torch.bfloat16)
    pool.set_mla_kv_buffer(2, loc, nope, rope)
    got_nope, got_rope = pool.get_mla_kv_buffer(2, loc)
    assert torch.equal(got_nope.cpu(), nope)
    assert torch.equal(got_rope.cpu(), rope)


# ------------------------------------------------------------------- host pool
@pytest.mark.parametrize("layout", list(HostLayout)[:3])
def test_host_views_and_table(layout: HostLayout) -> None:
    dev = make_pool()
    host = backend.create_host_pool(dev, layout=layout)
    assert isinstance(host, MLAHostPool)
    assert isinstance(host, CudaMLAHostPool)
    assert host.pin_memory == torch.cuda.is_available()
    assert host.kv_buffer.is_pinned() == torch.cuda.is_available()
    assert len(host.data_refs) == 3
    assert host.data_ptrs.dtype == torch.uint64
    assert host.data_ptrs.device == dev.device
    assert host.data_ptrs.cpu().tolist() == table(host.data_refs)
    item = 12 * 2
    for layer, ref in enumerate(host.data_refs):
        if layout is HostLayout.LAYER_FIRST:
            assert ref.is_contiguous()
            assert ref.shape == (24, 1, 12)
            assert ref.data_ptr() == host.kv_buffer.data_ptr() + layer * 24 * item
        else:
            assert not ref.is_contiguous()
            assert ref.data_ptr() == host.kv_buffer.data_ptr() + layer * (
                item if layout is HostLayout.PAGE_FIRST else 4 * item
            )


def test_supported_pairs() -> None:
    assert backend.supported_pairs == {
        HostLayout.LAYER_FIRST: frozenset({IOBackend.KERNEL, IOBackend.DIRECT}),
        HostLayout.PAGE_FIRST: frozenset({IOBackend.KERNEL}),
        HostLayout.PAGE_FIRST_DIRECT: frozenset({IOBackend.DIRECT}),
    }
    with pytest.raises(UnsupportedLayoutError, match="supported pairs"):
        backend.create_host_pool(make_pool(), layout="page_first", io_backend="direct")


@pytest.mark.parametrize("layout", [HostLayout.LAYER_FIRST, HostLayout.PAGE_FIRST])
def test_kernel_backend_is_one_launch(layout: HostLayout, monkeypatch: pytest.MonkeyPatch) -> None:
    from sgl_cuda._triton import kvcacheio as kv_mha  # the one row kernel of every kind's pool

    launches: list[dict[str, object]] = []
    real: Callable[..., None] = kv_mha.launch_copy_kv_rows

    def counting(*args: object, **kwargs: object) -> None:
        launches.append(kwargs)
        real(*args, **kwargs)

    monkeypatch.setattr(kv_mha, "launch_copy_kv_rows", counting)
    dev = make_pool(layers=4)
    fill_device_random(dev, 1)
    host = backend.create_host_pool(dev, layout=layout)
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "kernel")
    assert len(launches) == 1
    assert launches[0]["num_layers"] == 4
    assert launches[0]["src_table"]
    dst = make_pool(layers=4)
    for layer in range(4):
        host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "kernel")
    assert len(launches) == 5
    assert all(call["num_layers"] == 1 for call in launches[1:])
    for layer in range(4):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(dev, layer, d_idx))


def test_kernel_and_direct_agree() -> None:
    dev = make_pool(page_size=1, pages=10)
    fill_device_random(dev, 2)
    a = backend.create_host_pool(dev, layout="layer_first")
    b = backend.create_host_pool(dev, layout="layer_first")
    h = torch.tensor([7, 2, 3, 4, 19], dtype=torch.int64)
    d = torch.tensor([0, 5, 6, 7, 1], dtype=torch.int64)
    a.backup_from_device_all_layer(dev, h, d, "kernel")
    b.backup_from_device_all_layer(dev, h, d, "direct")
    a.synchronize()  # transfers are stream-ordered; wait before reading host bytes
    b.synchronize()
    assert torch.equal(a.kv_buffer.view(torch.int16), b.kv_buffer.view(torch.int16))


def test_foreign_per_layer_device_pool() -> None:
    """The kernel path also serves a torch-backend pool (no data_ptrs: table built)."""
    torch_dev = sgl_core.TorchBackend().create_device_pool(
        size=8,
        page_size=4,
        dtype=torch.bfloat16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        layer_num=3,
        device=DEVICE,
    )
    fill_device_random(torch_dev, 3)
    host = backend.create_host_pool(torch_dev, layout="page_first")
    idx = page_indices([1, 2], 4)
    host.backup_from_device_all_layer(torch_dev, idx, idx, "kernel")
    host.synchronize()
    expected = torch.stack([torch_dev.kv_buffer[i][4:12].cpu() for i in range(3)], dim=1)
    assert torch.equal(host.kv_buffer[4:12].view(torch.int16), expected.view(torch.int16))


def test_rejects_device_pool_of_other_kind() -> None:
    class Contiguous:
        size, page_size, layer_num = 8, 4, 3
        kv_lora_rank, qk_rope_head_dim, kv_cache_dim = 8, 4, 12
        dtype, device = torch.bfloat16, DEVICE

    host = backend.create_host_pool(make_pool(page_size=4, pages=2), layout="layer_first")
    idx = page_indices([0], 4)
    with pytest.raises(PoolMismatchError, match="per-layer"):
        host.backup_from_device_all_layer(Contiguous(), idx, idx, "kernel")  # type: ignore[arg-type]


# ---------------------------------------------------------------- availability
def test_backend_discovery() -> None:
    found = sgl_core.get_backend("cuda")
    assert found is backend
    assert isinstance(found, CudaBackend)
    assert isinstance(found, Backend)
    assert found.name == "cuda"
    assert found.is_available() is torch.cuda.is_available()
    assert "cuda" in sgl_core.available_backends()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_no_cuda_without_interpreter_is_a_clear_error() -> None:
    code = textwrap.dedent(
        """
        import torch, sgl_core
        from sgl_core.errors import BackendUnavailableError
        b = sgl_core.get_backend("cuda")
        assert b.name == "cuda" and b.is_available() is False
        for device in (None, "cpu", "cuda"):
            try:
                b.create_device_pool(size=4, page_size=4, dtype=torch.bfloat16,
                                     kv_lora_rank=8, qk_rope_head_dim=8, layer_num=1,
                                     device=device)
            except BackendUnavailableError as exc:
                assert "TRITON_INTERPRET" in str(exc), exc
            else:
                raise SystemExit(f"device={device!r} was accepted")
        import sgl_cuda.kvcacheio as io
        idx = torch.arange(2)
        t = torch.zeros(4, 1, 4, dtype=torch.bfloat16)
        try:
            io.transfer_kv_per_layer_mla(t, t.clone(), idx, idx, 8)
        except BackendUnavailableError:
            pass
        else:
            raise SystemExit("CPU kernel launch accepted without the interpreter")
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_kernel_io_rejects_unusable_device(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = make_pool()
    host = backend.create_host_pool(dev, layout="layer_first")
    if DEVICE.type == "cpu":
        monkeypatch.setattr(triton_kvcacheio, "INTERPRETED", False)
        idx = page_indices([0], 4)
        with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET"):
            host.backup_from_device_all_layer(dev, idx, idx, "kernel")


@pytest.mark.parametrize("reuse", [True, False])
def test_per_layer_loads_upload_indices_once(reuse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA, the layers of one validated load share one index upload (two tensors);
    changed index contents (even in the same tensor) upload again and load the new rows."""
    from sgl_cuda import _movers

    uploads: list[int] = []
    real = _movers.upload

    def counting(indices: torch.Tensor, device: torch.device) -> torch.Tensor:
        uploads.append(indices.numel())
        return real(indices, device)

    monkeypatch.setattr(_movers, "upload", counting)
    dev = make_pool(layers=4, pages=4)
    fill_device_random(dev, 4)
    host = backend.create_host_pool(dev, layout="layer_first")
    host.reuse_index_uploads = reuse
    h_idx, d_idx = page_indices([5, 0, 2], 4), page_indices([1, 3, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "kernel")
    uploads.clear()
    dst = make_pool(layers=4, pages=4)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()] if DEVICE.type == "cuda" else []
    for layer in range(4):
        if streams:  # alternate streams: a reused upload must be ordered on each
            with torch.cuda.stream(streams[layer % 2]):
                host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "kernel")
        else:
            host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "kernel")
    cached = reuse and DEVICE.type == "cuda"
    assert len(uploads) == (2 if cached else 8)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    for layer in range(4):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(dev, layer, d_idx))
    # Same tensor objects, new contents: host pages 5, 0, 2 now land on device page 0.
    d_idx.copy_(page_indices([0, 3, 2], 4))
    uploads.clear()
    host.load_to_device_per_layer(dst, h_idx, d_idx, 1, "kernel")
    assert len(uploads) == 2
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(
        device_rows(dst, 1, page_indices([0], 4)), device_rows(dev, 1, page_indices([1], 4))
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pinned memory)")
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_pinned_indices_reused_by_the_caller_at_once_load_the_rows_of_the_call(
    layout: str,
) -> None:
    """The kernel io uploads a snapshot of CPU indices: an engine that rewrites its
    (pinned) index tensor right after the call, while the GPU is still busy, must
    still get the rows the call named."""
    dev = make_pool(layers=2, pages=4)
    fill_device_random(dev, 4)
    host = backend.create_host_pool(dev, layout=layout)
    h_idx = page_indices([1, 2], 4).pin_memory()
    d_src = page_indices([1, 2], 4)
    host.backup_from_device_all_layer(dev, h_idx.clone(), d_src, "kernel")
    host.synchronize()
    dst = make_pool(layers=2, pages=4)
    d_idx = page_indices([3, 1], 4).pin_memory()
    torch.cuda._sleep(50_000_000)  # keep the stream busy so the upload is still queued
    host.load_to_device_per_layer(dst, h_idx, d_idx, 0, "kernel")
    h_idx.copy_(page_indices([0, 3], 4))  # the engine reuses its tensors at once
    d_idx.copy_(page_indices([2, 0], 4))
    torch.cuda.synchronize()
    expected = device_rows(dev, 0, d_src)
    assert torch.equal(device_rows(dst, 0, page_indices([3, 1], 4)), expected)
