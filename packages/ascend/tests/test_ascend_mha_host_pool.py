"""The Ascend MHA host pool on CPU tensors: layout, every copy path, per-layer loads, L3 pages."""

from __future__ import annotations

import pytest
import torch

import sgl_ascend
import sgl_core
from sgl_ascend import AscendMHADevicePool, AscendMHAHostPool
from sgl_ascend._backend import AscendBackend
from sgl_core.backend import NEVER, CopyTuning
from sgl_core.errors import (
    ArgumentTypeError,
    IndexOutOfRangeError,
    PageAlignmentError,
    PoolMismatchError,
    UnsupportedLayoutError,
)
from sgl_core.testing import page_indices, random_bits, read_memory

PS = 4
LAYERS = 3
HEADS, DIM, VDIM = 2, 8, 6
IO = "kernel_ascend"
LAYOUT = "page_first_kv_split"

#: Each kv-split copy path on CPU, pinned with a CopyTuning.
PATHS = {
    "run-copies": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_page_run_bytes=0),
    "gather": CopyTuning(by_address_min_block_bytes=NEVER, gather_below_page_run_bytes=NEVER),
    "by-address": CopyTuning(by_address_min_block_bytes=0, gather_below_page_run_bytes=0),
}


def make_dev(
    *, pages: int = 8, dtype: torch.dtype = torch.bfloat16, heads: int = HEADS, seed: int = 0
) -> AscendMHADevicePool:
    dev = sgl_ascend.backend.create_mha_device_pool(
        size=pages * PS,
        page_size=PS,
        dtype=dtype,
        head_num=heads,
        head_dim=DIM,
        layer_num=LAYERS,
        v_head_dim=VDIM,
    )
    gen = torch.Generator().manual_seed(seed)
    for buf in dev.components:
        buf.copy_(random_bits(tuple(buf.shape), buf.dtype, gen))
    return dev


def make_host(dev: AscendMHADevicePool, tuning: CopyTuning | None = None) -> AscendMHAHostPool:
    host = AscendBackend(tuning=tuning).create_host_pool(dev, layout=LAYOUT, io_backend=IO)
    assert isinstance(host, AscendMHAHostPool)  # the backend dispatches on the pool's kind
    assert host.tuning is tuning
    return host


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())


def snapshot(*pools: AscendMHADevicePool | AscendMHAHostPool) -> list[bytes]:
    out = []
    for pool in pools:
        bufs = pool.components if isinstance(pool, AscendMHADevicePool) else pool.buffers
        out += [raw(b) for b in bufs]
    return out


def test_host_pool_mirrors_device_page_major() -> None:
    dev = make_dev()
    host = make_host(dev)
    pn = host.page_num
    assert host.size == 2 * dev.size
    assert host.layout is sgl_core.HostLayout.PAGE_FIRST_KV_SPLIT
    assert host.k_buffer.shape == (pn, LAYERS, PS, HEADS, DIM)
    assert host.v_buffer.shape == (pn, LAYERS, PS, HEADS, VDIM)
    assert host.buffers == [host.k_buffer, host.v_buffer]
    assert (host.head_num, host.head_dim, host.v_head_dim) == (HEADS, DIM, VDIM)
    assert isinstance(host, sgl_core.MHAHostPool)
    assert isinstance(dev, sgl_core.MHADevicePool)
    assert host.moves_whole_pages(IO)


def test_backend_mha_pairs() -> None:
    backend = sgl_ascend.backend
    kv_split = sgl_core.HostLayout.PAGE_FIRST_KV_SPLIT
    direct = sgl_core.HostLayout.PAGE_FIRST_DIRECT
    only_kernel = frozenset({sgl_core.IOBackend.KERNEL_ASCEND})
    assert backend.supported_mha_pairs == {kv_split: only_kernel, direct: only_kernel}
    assert backend.default_mha_io("page_first_kv_split") is sgl_core.IOBackend.KERNEL_ASCEND
    assert backend.default_mha_io("page_first_direct") is sgl_core.IOBackend.KERNEL_ASCEND
    for layout in ("layer_first", "page_first", "page_head"):
        with pytest.raises(UnsupportedLayoutError):
            backend.default_mha_io(layout)
    dev = make_dev()
    with pytest.raises(UnsupportedLayoutError):
        backend.create_host_pool(dev, layout=LAYOUT, io_backend="direct")


def test_host_size_gb_counts_k_and_v() -> None:
    dev = make_dev()
    per_token = LAYERS * HEADS * (DIM + VDIM) * 2
    host = AscendMHAHostPool(dev, layout=LAYOUT, host_size_gb=per_token * PS * 7 / 1e9)
    assert host.size == 7 * PS
    assert sum(host.get_contiguous_buf_infos()[1]) == per_token * host.size


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_backup_puts_each_row_where_the_layout_says(path: str, dtype: torch.dtype) -> None:
    dev = make_dev(dtype=dtype)
    host = make_host(dev, PATHS[path])
    hp, dp = [9, 10, 2, 14, 15, 5], [1, 2, 0, 6, 7, 3]
    host.backup_from_device_all_layer(dev, page_indices(hp, PS), page_indices(dp, PS), IO)
    for h, d in zip(hp, dp, strict=True):
        for layer in range(LAYERS):
            assert raw(host.k_buffer[h, layer]) == raw(dev.k_buffer[layer, d])
            assert raw(host.v_buffer[h, layer]) == raw(dev.v_buffer[layer, d])
    untouched = sorted(set(range(host.page_num)) - set(hp))
    assert not host.k_buffer[untouched].view(torch.uint8).any()
    assert not host.v_buffer[untouched].view(torch.uint8).any()


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("heads", [1, 4])
def test_per_layer_load_moves_only_that_layer(path: str, heads: int) -> None:
    src = make_dev(heads=heads, seed=1)
    host = make_host(src, PATHS[path])
    hp, dp = [3, 4, 5, 12, 0], [6, 7, 8, 1, 4]
    host.backup_from_device_all_layer(src, page_indices(hp, PS), page_indices(dp, PS), IO)
    dst_pages = [2, 3, 4, 8, 0]
    others = sorted(set(range(src.page_num)) - set(dst_pages))
    for layer in range(LAYERS):
        dst = make_dev(heads=heads, seed=2)
        before = [b.clone() for b in dst.components]
        host.load_to_device_per_layer(
            dst, page_indices(hp, PS), page_indices(dst_pages, PS), layer, IO
        )
        for got, old, orig in zip(dst.components, before, src.components, strict=True):
            for d_src, d_dst in zip(dp, dst_pages, strict=True):
                assert raw(got[layer, d_dst]) == raw(orig[layer, d_src])
            assert raw(got[layer, others]) == raw(old[layer, others])
            for other in set(range(LAYERS)) - {layer}:
                assert raw(got[other]) == raw(old[other])


def test_round_trip_through_rows() -> None:
    dev = make_dev()
    host = make_host(dev)
    loc = page_indices([5, 6], PS)
    k, v = dev.get_kv_buffer(2, loc)
    host.backup_from_device_all_layer(dev, page_indices([0, 1], PS), loc, IO)
    other = make_dev(seed=9)
    host.load_to_device_per_layer(other, page_indices([0, 1], PS), page_indices([1, 2], PS), 2, IO)
    got_k, got_v = other.get_kv_buffer(2, page_indices([1, 2], PS))
    assert raw(got_k) == raw(k)
    assert raw(got_v) == raw(v)


def test_rejected_transfers_change_nothing() -> None:
    dev = make_dev()
    host = make_host(dev)
    good = page_indices([0, 1], PS)
    before = snapshot(dev, host)
    with pytest.raises(PageAlignmentError):
        host.backup_from_device_all_layer(dev, good, good + 1, IO)
    with pytest.raises(IndexOutOfRangeError):
        host.load_to_device_per_layer(dev, good, good + dev.size, 0, IO)
    with pytest.raises(UnsupportedLayoutError):
        host.backup_from_device_all_layer(dev, good, good, "direct")
    other_heads = make_dev(heads=HEADS * 2)
    with pytest.raises(PoolMismatchError):
        host.backup_from_device_all_layer(other_heads, good, good, IO)
    assert snapshot(dev, host) == before


def test_device_buffers_replaced_are_rejected() -> None:
    dev = make_dev()
    host = make_host(dev)
    good = page_indices([0], PS)
    before = snapshot(host)
    dev.v_buffer = dev.v_buffer[:, :-1]
    with pytest.raises(PoolMismatchError, match="v_buffer"):
        host.backup_from_device_all_layer(dev, good, good, IO)
    dev.v_buffer = torch.zeros_like(dev.k_buffer)
    with pytest.raises(PoolMismatchError, match="v_buffer"):
        host.backup_from_device_all_layer(dev, good, good, IO)
    page_major = (dev.page_num, LAYERS, PS, HEADS, VDIM)
    dev.v_buffer = dev.k_buffer.new_zeros(page_major).transpose(0, 1)  # right shape, strided
    assert dev.v_buffer.shape == (LAYERS, dev.page_num, PS, HEADS, VDIM)
    with pytest.raises(PoolMismatchError, match="v_buffer"):
        host.backup_from_device_all_layer(dev, good, good, IO)
    dev.v_buffer = torch.zeros(LAYERS, dev.page_num, PS, HEADS, VDIM, dtype=torch.float16)
    with pytest.raises(PoolMismatchError, match="v_buffer"):
        host.backup_from_device_all_layer(dev, good, good, IO)
    assert snapshot(host) == before


def test_buffer_replaced_between_layer_loads_is_validated_again() -> None:
    dev = make_dev()
    host = make_host(dev)
    hp, dp = page_indices([0, 1], PS), page_indices([2, 3], PS)
    host.backup_from_device_all_layer(dev, hp, dp, IO)
    host.load_to_device_per_layer(dev, hp, dp, 0, IO)
    dev.k_buffer = dev.k_buffer[:, :-1]  # the engine resized its cache between layers
    before = snapshot(dev, host)
    with pytest.raises(PoolMismatchError, match="k_buffer"):
        host.load_to_device_per_layer(dev, hp, dp, 1, IO)
    assert snapshot(dev, host) == before


def test_layer_views_are_the_pools_memory() -> None:
    dev = make_dev()
    host = make_host(dev)
    views = host.layer_views(dev, 1)
    assert [tuple(d.shape) for d, _ in views] == [
        (dev.slot_count, HEADS * DIM),
        (dev.slot_count, HEADS * VDIM),
    ]
    assert [tuple(h.shape) for _, h in views] == [
        (host.page_num, PS, HEADS * DIM),
        (host.page_num, PS, HEADS * VDIM),
    ]
    (dk, hk), (dv, hv) = views
    assert dk.data_ptr() == dev.k_buffer[1].data_ptr()
    assert dv.data_ptr() == dev.v_buffer[1].data_ptr()
    hk[3, 2] = dk[5]
    hv[3, 2] = dv[5]
    assert raw(host.k_buffer[3, 1, 2]) == raw(dev.k_buffer[1, 1, 1])
    assert raw(host.v_buffer[3, 1, 2]) == raw(dev.v_buffer[1, 1, 1])
    with pytest.raises(PoolMismatchError):
        host.layer_views(make_dev(heads=1), 0)


def test_only_ascend_mha_device_pools() -> None:
    mla = sgl_ascend.backend.create_device_pool(
        size=8 * PS, page_size=PS, dtype=torch.bfloat16, kv_lora_rank=HEADS * DIM,
        qk_rope_head_dim=HEADS * VDIM, layer_num=LAYERS,
    )  # fmt: skip
    with pytest.raises(PoolMismatchError):
        AscendMHAHostPool(mla, layout=LAYOUT)  # type: ignore[arg-type]
    torch_pool = sgl_core.get_backend("torch").create_mha_device_pool(
        size=8 * PS, page_size=PS, dtype=torch.bfloat16, head_num=HEADS, head_dim=DIM,
        layer_num=LAYERS, v_head_dim=VDIM,
    )  # fmt: skip
    with pytest.raises(PoolMismatchError, match="AscendMHADevicePool"):
        AscendMHAHostPool(torch_pool, layout=LAYOUT)
    dev = make_dev()  # same geometry as torch_pool: only the storage kind differs
    host = make_host(dev)
    good = page_indices([0, 1], PS)
    before = snapshot(dev, host)
    with pytest.raises(PoolMismatchError, match="AscendMHADevicePool"):
        host.backup_from_device_all_layer(torch_pool, good, good, IO)
    with pytest.raises(PoolMismatchError, match="AscendMHADevicePool"):
        host.load_to_device_per_layer(torch_pool, good, good, 0, IO)
    assert snapshot(dev, host) == before
    with pytest.raises(UnsupportedLayoutError):
        AscendMHAHostPool(make_dev(), layout="page_first")


class _EnginePool:
    """An engine's own per-layer MHA pool (``device`` a str, lists of layers)."""

    def __init__(self) -> None:
        self.size, self.page_size, self.layer_num = 8 * PS, PS, LAYERS
        self.head_num, self.head_dim, self.v_head_dim = HEADS, DIM, VDIM
        self.device = "cpu"
        self.k_buffer = [torch.zeros(9 * PS, HEADS, DIM, dtype=torch.bfloat16)] * LAYERS
        self.v_buffer = [torch.zeros(9 * PS, HEADS, VDIM, dtype=torch.bfloat16)] * LAYERS


def test_engine_pools_are_refused_by_name() -> None:
    # The kv-split host pool addresses the contiguous 5-D tensors only.
    with pytest.raises(PoolMismatchError, match="AscendMHADevicePool"):
        sgl_ascend.backend.create_host_pool(_EnginePool(), layout=LAYOUT)  # type: ignore[call-overload]


# -------------------------------------------------------------------- L3 pages
def test_flat_page_is_k_then_v_and_meta_matches() -> None:
    dev = make_dev()
    host = make_host(dev)
    host.backup_from_device_all_layer(dev, page_indices([0, 3], PS), page_indices([4, 2], PS), IO)
    page = host.get_data_page(3 * PS)
    assert page.dtype == torch.bfloat16
    assert raw(page) == raw(dev.k_buffer[:, 2]) + raw(dev.v_buffer[:, 2])
    assert raw(host.get_data_page(3 * PS, flat=False)) == raw(page)
    ptrs, sizes = host.get_page_buffer_meta(page_indices([3, 0], PS))
    k_bytes, v_bytes = LAYERS * PS * HEADS * DIM * 2, LAYERS * PS * HEADS * VDIM * 2
    assert sizes == [k_bytes, v_bytes, k_bytes, v_bytes]
    assert read_memory(ptrs[0], sizes[0]) + read_memory(ptrs[1], sizes[1]) == raw(page)
    assert read_memory(ptrs[2], sizes[2]) + read_memory(ptrs[3], sizes[3]) == raw(
        host.get_data_page(0)
    )
    bases, totals, objects = host.get_contiguous_buf_infos()
    assert bases == [host.k_buffer.data_ptr(), host.v_buffer.data_ptr()]
    assert objects == [k_bytes, v_bytes]
    assert totals == [k_bytes * host.page_num, v_bytes * host.page_num]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e5m2])
def test_set_from_flat_page_round_trips_and_checks_first(dtype: torch.dtype) -> None:
    dev = make_dev(dtype=dtype)
    host = make_host(dev)
    host.backup_from_device_all_layer(dev, page_indices([1], PS), page_indices([4], PS), IO)
    page = host.get_data_page(PS)
    host.set_from_flat_data_page(5 * PS, page)
    assert raw(host.get_data_page(5 * PS)) == raw(page)
    assert raw(host.k_buffer[5]) == raw(dev.k_buffer[:, 4])
    assert raw(host.v_buffer[5]) == raw(dev.v_buffer[:, 4])
    dummy = host.get_dummy_flat_data_page()
    assert dummy.dtype == page.dtype and dummy.numel() == page.numel()
    assert not dummy.view(torch.uint8).any()
    before = snapshot(host)
    for bad, error in (
        (page[:-1], PoolMismatchError),
        (page.float(), PoolMismatchError),
        (page.tolist(), ArgumentTypeError),
    ):
        with pytest.raises(error):
            host.set_from_flat_data_page(2 * PS, bad)  # type: ignore[arg-type]
    with pytest.raises(PageAlignmentError):
        host.set_from_flat_data_page(1, page)
    with pytest.raises(IndexOutOfRangeError):
        host.get_data_page(host.size)
    with pytest.raises(PageAlignmentError):
        host.get_page_buffer_meta(torch.arange(1, PS + 1))
    assert snapshot(host) == before


def test_engine_layout_name_is_the_same_pool() -> None:
    # SGLang names the Ascend MHA pairing page_first_direct + kernel_ascend: the
    # same tensors, byte order and page objects as page_first_kv_split.
    dev = make_dev()
    a = sgl_ascend.backend.create_host_pool(dev, layout="page_first_kv_split")
    b = sgl_ascend.backend.create_host_pool(dev, layout="page_first_direct")
    assert isinstance(a, AscendMHAHostPool) and isinstance(b, AscendMHAHostPool)
    assert b.layout is sgl_core.HostLayout.PAGE_FIRST_DIRECT
    assert [t.shape for t in a.buffers] == [t.shape for t in b.buffers]
    host_idx = page_indices([0, 1], PS)
    dev_idx = page_indices([5, 2], PS)
    for host in (a, b):
        host.backup_from_device_all_layer(dev, host_idx, dev_idx, IO)
    for start in (0, PS):
        page = a.get_data_page(start)
        assert raw(page) == raw(b.get_data_page(start))
        assert raw(page) != raw(torch.zeros_like(page))
    assert a.get_page_buffer_meta(host_idx)[1] == b.get_page_buffer_meta(host_idx)[1]


def test_page_first_direct_pages_are_the_torch_pools_pages() -> None:
    # Both backends file page_first_direct MHA pages under one L3 format, so a page
    # one stores the other may load: that hit is right only while the bytes match.
    from sgl_core.l3._format import page_format

    dev = make_dev()
    ref = sgl_core.get_backend("torch").create_mha_device_pool(
        size=dev.size, page_size=PS, dtype=dev.dtype, head_num=HEADS, head_dim=DIM,
        layer_num=LAYERS, v_head_dim=VDIM,
    )  # fmt: skip
    loc = page_indices([5, 2], PS)
    for layer in range(LAYERS):
        ref.set_kv_buffer(layer, loc, *dev.get_kv_buffer(layer, loc))
    ours = sgl_ascend.backend.create_host_pool(dev, layout="page_first_direct")
    theirs = sgl_core.get_backend("torch").create_host_pool(ref, layout="page_first_direct")
    assert page_format(ours) == page_format(theirs)
    host_idx = page_indices([0, 1], PS)
    ours.backup_from_device_all_layer(dev, host_idx, loc, IO)
    theirs.backup_from_device_all_layer(ref, host_idx, loc, "direct")
    for start in (0, PS):
        assert raw(ours.get_data_page(start)) == raw(theirs.get_data_page(start))
