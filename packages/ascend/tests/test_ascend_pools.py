"""Ascend device/host pools on CPU tensors: layout, indexer, L3 pages, errors."""

from __future__ import annotations

import pytest
import torch

import sgl_ascend
import sgl_core
from sgl_ascend import AscendMLADevicePool, AscendMLAHostPool
from sgl_core.errors import (
    BackendUnavailableError,
    DeviceError,
    LayerIndexError,
    PageAlignmentError,
    PoolMismatchError,
    PoolSizeError,
    ShapeMismatchError,
    UnsupportedLayoutError,
)
from sgl_core.testing import page_indices, random_bits, read_memory

PS = 4
LAYERS = 3
RANK, ROPE, IDX = 8, 4, 6
IO = "kernel_ascend"
LAYOUT = "page_first_kv_split"


def make_dev(indexer: bool = True, *, scale: bool = True, pages: int = 5) -> AscendMLADevicePool:
    extra: dict[str, object] = {}
    if indexer:
        extra = {"index_head_dim": IDX, "indexer_layer_ids": [2, 0], "with_index_k_scale": scale}
    return sgl_ascend.backend.create_device_pool(
        size=pages * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE,
        layer_num=LAYERS,
        **extra,  # type: ignore[arg-type]
    )


def fill(dev: AscendMLADevicePool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for buf in (dev.k_buffer, dev.v_buffer, dev.index_k_buffer, dev.index_k_scale_buffer):
        if buf is not None:
            buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))


def make_host(dev: AscendMLADevicePool) -> AscendMLAHostPool:
    return sgl_ascend.backend.create_host_pool(dev, layout=LAYOUT, io_backend=IO)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ------------------------------------------------------------------- device pool
def test_device_pool_is_contiguous_layer_major() -> None:
    dev = make_dev()
    page_num = (dev.size + PS) // PS
    assert dev.page_num == page_num == 6
    assert dev.k_buffer.shape == (LAYERS, page_num, PS, 1, RANK)
    assert dev.v_buffer.shape == (LAYERS, page_num, PS, 1, ROPE)
    assert dev.index_k_buffer is not None
    assert dev.index_k_scale_buffer is not None
    assert dev.index_k_buffer.shape == (2, page_num, PS, 1, IDX)
    assert dev.index_k_scale_buffer.shape == (2, page_num, PS, 1, 1)
    assert dev.index_k_scale_buffer.dtype == torch.float32
    for buf in (dev.k_buffer, dev.v_buffer, dev.index_k_buffer):
        assert buf.is_contiguous()
        assert buf.dtype == torch.bfloat16
    assert not hasattr(dev, "data_ptrs")
    assert not hasattr(dev, "kv_buffer")
    assert dev.indexer_layer_ids == (0, 2)
    assert [dev.indexer_slot(i) for i in range(LAYERS)] == [0, None, 1]
    assert isinstance(dev, sgl_core.MLADevicePool)


def test_token_maps_to_page_and_offset() -> None:
    dev = make_dev(indexer=False)
    gen = torch.Generator().manual_seed(0)
    loc = torch.tensor([0, 5, 23, 13], dtype=torch.int64)  # 23 = last slot of the padding page
    nope = random_bits((4, 1, RANK), torch.bfloat16, gen)
    rope = random_bits((4, 1, ROPE), torch.bfloat16, gen)
    dev.set_mla_kv_buffer(1, loc, nope, rope)
    for i, t in enumerate(loc.tolist()):
        assert same(dev.k_buffer[1, t // PS, t % PS], nope[i])
        assert same(dev.v_buffer[1, t // PS, t % PS], rope[i])
    got_nope, got_rope = dev.get_mla_kv_buffer(1, loc)
    assert same(got_nope, nope)
    assert same(got_rope, rope)
    assert not dev.k_buffer[0].view(torch.int16).any()
    assert not dev.k_buffer[2].view(torch.int16).any()
    with pytest.raises(IndexError):
        dev.get_mla_kv_buffer(1, torch.tensor([24]))
    with pytest.raises(PoolMismatchError):
        dev.set_mla_kv_buffer(1, loc, nope[:3], rope)


def test_index_k_rows() -> None:
    dev = make_dev()
    loc = torch.tensor([1, 9], dtype=torch.int64)
    keys = torch.randn(2, 1, IDX).bfloat16()
    scales = torch.rand(2, 1, 1)
    dev.set_index_k_buffer(2, loc, keys, scales)
    got_k, got_s = dev.get_index_k_buffer(2, loc)
    assert torch.equal(got_k, keys)
    assert got_s is not None
    assert torch.equal(got_s, scales)
    assert torch.equal(dev.index_k_buffer[1, 2, 1, 0], keys[1, 0])  # type: ignore[index]
    with pytest.raises(LayerIndexError, match="no indexer"):
        dev.set_index_k_buffer(1, loc, keys, scales)
    with pytest.raises(PoolMismatchError):
        dev.set_index_k_buffer(0, loc, keys)


def device_bytes(dev: AscendMLADevicePool) -> list[torch.Tensor]:
    return [b.clone().view(torch.uint8) for b in dev.components if b is not None]


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.float16])
def test_rows_of_another_dtype_are_refused_not_converted(dtype: torch.dtype) -> None:
    """No silent cast into the pool (issue 28): ShapeMismatchError, every byte unchanged."""
    dev = make_dev()
    fill(dev, 7)
    loc = torch.tensor([1, 9], dtype=torch.int64)
    nope = torch.ones(2, 1, RANK, dtype=torch.bfloat16)
    rope = torch.ones(2, 1, ROPE, dtype=torch.bfloat16)
    keys = torch.ones(2, 1, IDX, dtype=torch.bfloat16)
    scales = torch.ones(2, 1, 1, dtype=torch.float32)
    calls = [
        (dev.set_mla_kv_buffer, (0, loc, nope.to(dtype), rope)),
        (dev.set_mla_kv_buffer, (0, loc, nope, rope.to(dtype))),
        (dev.set_index_k_buffer, (2, loc, keys.to(dtype), scales)),
        (dev.set_index_k_buffer, (2, loc, keys, scales.to(torch.bfloat16))),
        (dev.set_mla_kv_buffer, (0, loc, nope.to("meta"), rope)),
    ]
    before = device_bytes(dev)
    for call, args in calls:
        meta = any(isinstance(a, torch.Tensor) and a.is_meta for a in args)
        with pytest.raises(DeviceError if meta else ShapeMismatchError):
            call(*args)  # type: ignore[operator]
        assert all(same(a, b) for a, b in zip(before, device_bytes(dev), strict=True))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"indexer_layer_ids": [0]}, PoolSizeError),
        ({"with_index_k_scale": True}, PoolSizeError),
        ({"index_head_dim": 0}, PoolSizeError),
        ({"index_head_dim": 4, "indexer_layer_ids": [0, 0]}, PoolSizeError),
        ({"index_head_dim": 4, "indexer_layer_ids": [3]}, LayerIndexError),
        ({"size": 6}, PoolSizeError),
    ],
)
def test_device_pool_bad_arguments(kwargs: dict[str, object], error: type[Exception]) -> None:
    args: dict[str, object] = {
        "size": 8,
        "page_size": PS,
        "dtype": torch.bfloat16,
        "kv_lora_rank": RANK,
        "qk_rope_head_dim": ROPE,
        "layer_num": LAYERS,
        **kwargs,
    }
    with pytest.raises(error):
        AscendMLADevicePool(**args)  # type: ignore[arg-type]


def test_npu_without_torch_npu_says_what_to_install() -> None:
    assert not sgl_ascend.backend.is_available()
    with pytest.raises(
        BackendUnavailableError, match=r"pip install './packages/ascend\[npu\]'"
    ) as info:
        make_dev_on("npu:0")
    assert "CANN" in str(info.value)


def make_dev_on(device: str) -> AscendMLADevicePool:
    return AscendMLADevicePool(
        size=8,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE,
        layer_num=LAYERS,
        device=device,
    )


def test_backend_discovery() -> None:
    assert "ascend" in sgl_core.available_backends()
    sgl_core.clear_backend_cache()
    try:
        assert sgl_core.get_backend("ascend") is sgl_ascend.backend
        assert isinstance(sgl_ascend.backend, sgl_core.Backend)
    finally:
        sgl_core.clear_backend_cache()
    assert make_dev_on("cpu").device == torch.device("cpu")
    assert make_dev(indexer=False).device == torch.device("cpu")  # device=None without NPU


# --------------------------------------------------------------------- host pool
def test_host_pool_mirrors_device_components() -> None:
    dev = make_dev()
    host = make_host(dev)
    pn = host.page_num
    assert host.size == 2 * dev.size
    assert host.layout is sgl_core.HostLayout.PAGE_FIRST_KV_SPLIT
    assert host.k_buffer.shape == (pn, LAYERS, PS, 1, RANK)
    assert host.v_buffer.shape == (pn, LAYERS, PS, 1, ROPE)
    assert host.index_k_buffer is not None
    assert host.index_k_scale_buffer is not None
    assert host.index_k_buffer.shape == (pn, 2, PS, 1, IDX)
    assert host.index_k_scale_buffer.shape == (pn, 2, PS, 1, 1)
    plain = make_host(make_dev(indexer=False))
    assert plain.index_k_buffer is None
    assert plain.index_k_scale_buffer is None
    assert isinstance(host, sgl_core.MLAHostPool)


def test_host_size_gb_counts_indexer_bytes() -> None:
    dev = make_dev()
    per_token = LAYERS * (RANK + ROPE) * 2 + 2 * (IDX * 2 + 4)
    host = AscendMLAHostPool(dev, layout=LAYOUT, host_size_gb=per_token * PS * 7 / 1e9)
    assert host.size == 7 * PS
    total = sum(host.get_contiguous_buf_infos()[1])
    assert total == per_token * host.size


def test_host_pool_rejects_other_device_pools() -> None:
    torch_dev = sgl_core.get_backend("torch").create_device_pool(
        size=8, page_size=PS, dtype=torch.bfloat16, kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE, layer_num=LAYERS,
    )  # fmt: skip
    with pytest.raises(PoolMismatchError, match="AscendMLADevicePool"):
        AscendMLAHostPool(torch_dev, layout=LAYOUT)
    with pytest.raises(UnsupportedLayoutError, match="supported pairs"):
        AscendMLAHostPool(make_dev(), layout="page_first_direct")
    host = make_host(make_dev())
    idx = page_indices([1], PS)
    for other in (make_dev(indexer=False), make_dev(scale=False), torch_dev):
        with pytest.raises(PoolMismatchError):
            host.backup_from_device_all_layer(other, idx, idx, IO)


def indexer_buffers(
    pool: AscendMLADevicePool | AscendMLAHostPool,
) -> tuple[torch.Tensor, torch.Tensor]:
    keys, scales = pool.index_k_buffer, pool.index_k_scale_buffer
    assert keys is not None
    assert scales is not None
    return keys, scales


def test_backup_and_per_layer_load_cover_indexer() -> None:
    src, dst = make_dev(), make_dev()
    fill(src, 1)
    fill(dst, 2)
    host = make_host(src)
    src_ik, src_sc = indexer_buffers(src)
    dst_ik, dst_sc = indexer_buffers(dst)
    host_ik, host_sc = indexer_buffers(host)
    d_idx = page_indices([4, 1, 2], PS)
    h_idx = page_indices([0, 7, 8], PS)
    host.backup_from_device_all_layer(src, h_idx, d_idx, IO)
    for hp, dp in ((0, 4), (7, 1), (8, 2)):
        assert same(host.k_buffer[hp], src.k_buffer[:, dp])
        assert same(host.v_buffer[hp], src.v_buffer[:, dp])
        assert same(host_ik[hp], src_ik[:, dp])
        assert same(host_sc[hp], src_sc[:, dp])
    k_before, ik_before = dst.k_buffer.clone(), dst_ik.clone()
    host.load_to_device_per_layer(dst, h_idx, d_idx, 1, IO)  # layer 1 has no indexer row
    assert same(dst_ik, ik_before)
    assert same(dst.k_buffer[[0, 2]], k_before[[0, 2]])
    assert same(dst.k_buffer[1, [4, 1, 2]], src.k_buffer[1, [4, 1, 2]])
    assert same(dst.k_buffer[1, [0, 3, 5]], k_before[1, [0, 3, 5]])
    host.load_to_device_per_layer(dst, h_idx, d_idx, 2, IO)  # indexer slot 1
    assert same(dst_ik[0], ik_before[0])
    assert same(dst_ik[1, [4, 1, 2]], src_ik[1, [4, 1, 2]])
    assert same(dst_sc[1, [4, 1, 2]], src_sc[1, [4, 1, 2]])


def test_partial_pages_rejected_before_any_copy() -> None:
    dev = make_dev()
    fill(dev, 3)
    host = make_host(dev)
    snap = [b.clone() for b in host.buffers]
    with pytest.raises(PageAlignmentError, match="host_indices"):
        host.backup_from_device_all_layer(dev, torch.arange(3), torch.arange(3), IO)
    with pytest.raises(PageAlignmentError, match="device_indices"):
        host.backup_from_device_all_layer(dev, torch.arange(4), torch.arange(1, 5), IO)
    assert all(same(a, b) for a, b in zip(snap, host.buffers, strict=True))


# ---------------------------------------------------------------------- L3 pages
@pytest.mark.parametrize("variant", ["plain", "index_k", "index_k+scale"])
def test_flat_page_byte_order(variant: str) -> None:
    dev = make_dev(indexer=variant != "plain", scale=variant == "index_k+scale")
    fill(dev, 4)
    host = make_host(dev)
    idx = page_indices([3], PS)
    host.backup_from_device_all_layer(dev, idx, page_indices([2], PS), IO)
    page = host.get_data_page(3 * PS)
    expected_dtype = torch.uint8 if variant == "index_k+scale" else torch.bfloat16
    assert page.dtype == host.flat_page_dtype == expected_dtype
    parts = [dev.k_buffer[:, 2], dev.v_buffer[:, 2]]
    parts += [b[:, 2] for b in (dev.index_k_buffer, dev.index_k_scale_buffer) if b is not None]
    expected = b"".join(p.contiguous().view(torch.uint8).numpy().tobytes() for p in parts)
    assert page.view(torch.uint8).numpy().tobytes() == expected
    assert torch.equal(host.get_data_page(3 * PS, flat=False), page)
    ptrs, sizes = host.get_page_buffer_meta(idx)
    assert len(ptrs) == len(parts)
    assert b"".join(read_memory(p, s) for p, s in zip(ptrs, sizes, strict=True)) == expected
    # set_from_flat_data_page writes the same byte order back.
    host.set_from_flat_data_page(0, page)
    assert same(host.get_data_page(0), page)
    dummy = host.get_dummy_flat_data_page()
    assert dummy.dtype == page.dtype
    assert dummy.numel() == page.numel() == host.flat_page_numel
    with pytest.raises(PoolMismatchError):
        host.set_from_flat_data_page(0, page.view(torch.uint8) if variant == "plain" else page[1:])
    bases, totals, objects = host.get_contiguous_buf_infos()
    assert bases == [b.data_ptr() for b in host.buffers]
    assert objects == sizes
    assert totals == [o * host.page_num for o in objects]


def test_flat_page_unaligned_slice_is_accepted() -> None:
    host = make_host(make_dev())
    page = host.get_dummy_flat_data_page()
    page.copy_(torch.randint(0, 255, page.shape, dtype=torch.uint8))
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), page])[1:]  # odd storage offset
    host.set_from_flat_data_page(PS, shifted)
    assert torch.equal(host.get_data_page(PS), page)


def test_capabilities_and_layer_views() -> None:
    from sgl_core.backend import LayerViews

    dev = make_dev(indexer=False)
    fill(dev, 4)
    host = make_host(dev)
    assert host.moves_whole_pages("kernel_ascend") is True
    with pytest.raises(UnsupportedLayoutError):
        host.moves_whole_pages("direct")
    host.synchronize()  # CPU tensors: nothing queued, returns
    assert isinstance(host, LayerViews)
    idx = page_indices([1, 3], dev.page_size)
    host.backup_from_device_all_layer(dev, idx, idx, "kernel_ascend")
    (k_rows, k_pages), (v_rows, v_pages) = host.layer_views(dev, 1)
    assert k_rows.shape[-1] == dev.kv_lora_rank and v_rows.shape[-1] == dev.qk_rope_head_dim
    assert k_rows.data_ptr() == dev.k_buffer[1].data_ptr()
    for t in idx.tolist():
        page, offset = divmod(t, dev.page_size)
        assert same(k_pages[page, offset], k_rows[t])
        assert same(v_pages[page, offset], v_rows[t])
    with pytest.raises(LayerIndexError):
        host.layer_views(dev, dev.layer_num)
