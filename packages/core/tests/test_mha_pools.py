"""The torch backend's MHA pools: byte orders, copy paths, dispatch, device-pool checks.

Layout-independent behaviour (round trips, rejections, concurrency, L3
helpers) is in the conformance suite's MHA cases (``sgl_core.testing``);
this file pins what is specific to the torch pools: the exact host byte
order of each layout (SGLang's), every ``direct`` copy path, and dispatch.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core import HostLayout, IOBackend, errors
from sgl_core.backend import NEVER, CopyTuning, MHATokenHostPool, PerLayerMHADevicePool
from sgl_core.testing import (
    device_rows,
    fill_device_random,
    page_indices,
    read_memory,
    same_bytes,
    snapshot,
)

LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
PATHS = {
    "stacked": CopyTuning(
        stacked_min_run_bytes=0, by_address_min_block_bytes=NEVER, gather_below_run_bytes=0
    ),
    "by_address": CopyTuning(
        stacked_min_run_bytes=NEVER, by_address_min_block_bytes=0, gather_below_run_bytes=0
    ),
    "gather": CopyTuning(
        stacked_min_run_bytes=NEVER,
        by_address_min_block_bytes=NEVER,
        gather_below_run_bytes=NEVER,
    ),
    "slices": CopyTuning(
        stacked_min_run_bytes=NEVER, by_address_min_block_bytes=NEVER, gather_below_run_bytes=0
    ),
}


def pools(
    layout: str,
    *,
    page_size: int = 4,
    v_head_dim: int | None = None,
    tuning: CopyTuning | None = None,
    dtype: torch.dtype = torch.bfloat16,
    ratio: float = 2.0,
) -> tuple[PerLayerMHADevicePool, MHATokenHostPool]:
    backend = sgl_core.TorchBackend(tuning=tuning)
    dev = backend.create_mha_device_pool(
        size=6 * page_size,
        page_size=page_size,
        dtype=dtype,
        head_num=2,
        head_dim=8,
        layer_num=3,
        v_head_dim=v_head_dim,
    )
    host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=ratio)
    assert isinstance(dev, PerLayerMHADevicePool) and isinstance(host, MHATokenHostPool)
    return dev, host


def test_device_pool_geometry_and_accessors() -> None:
    dev, _ = pools("layer_first", v_head_dim=4)
    assert (dev.size, dev.page_size, dev.layer_num, dev.head_num) == (24, 4, 3, 2)
    assert (dev.head_dim, dev.v_head_dim) == (8, 4)
    assert dev.k_buffer[0].shape == (28, 2, 8) and dev.v_buffer[0].shape == (28, 2, 4)
    assert isinstance(dev, sgl_core.MHADevicePool)
    loc = torch.tensor([3, 27])
    k = torch.randn(2, 2, 8).bfloat16()
    v = torch.randn(2, 2, 4).bfloat16()
    dev.set_kv_buffer(1, loc, k, v)
    got_k, got_v = dev.get_kv_buffer(1, loc)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    with pytest.raises(errors.PoolMismatchError):
        dev.set_kv_buffer(1, loc, v, k)  # shapes swapped
    with pytest.raises(errors.IndexOutOfRangeError):
        dev.get_kv_buffer(0, torch.tensor([28]))
    with pytest.raises(errors.LayerIndexError):
        dev.get_kv_buffer(3, loc)
    with pytest.raises(errors.ArgumentTypeError):
        dev.set_kv_buffer(0, loc, [1.0], v)  # type: ignore[arg-type]


def _expected_host(host: MHATokenHostPool, dev: PerLayerMHADevicePool, c: int) -> torch.Tensor:
    """Component ``c`` of the host as the layout formula says, from host slot t = device slot t."""
    layers = dev.k_buffer if c == 0 else dev.v_buffer
    rows = torch.stack([layer[: host.size] for layer in layers])  # (L, size, H, D)
    ps, pages = host.page_size, host.page_num
    if host.layout is HostLayout.LAYER_FIRST:
        return rows
    if host.layout is HostLayout.PAGE_FIRST:
        return rows.transpose(0, 1)
    paged = rows.view(rows.shape[0], pages, ps, *rows.shape[2:])  # (L, pages, ps, H, D)
    if host.layout is HostLayout.PAGE_FIRST_DIRECT:
        return paged.transpose(0, 1)  # (pages, L, ps, H, D)
    return paged.permute(1, 3, 2, 0, 4)  # page_head: (pages, H, ps, L, D)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("v_head_dim", [None, 4])
def test_host_byte_order_is_the_documented_one(layout: str, v_head_dim: int | None) -> None:
    dev, host = pools(layout, v_head_dim=v_head_dim, ratio=1.0)
    fill_device_random(dev, 1)
    idx = torch.arange(host.size)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    for c, buf in enumerate((host.k_buffer, host.v_buffer)):
        assert torch.equal(buf.view(torch.int16), _expected_host(host, dev, c).view(torch.int16))
    if v_head_dim is None:  # SGLang's one (2, ...) buffer: K half then V half
        assert host.kv_buffer is not None
        assert host.k_buffer.data_ptr() == host.kv_buffer.data_ptr()
        assert host.v_buffer.data_ptr() == host.kv_buffer[1].data_ptr()
    else:
        assert host.kv_buffer is None


@pytest.mark.parametrize(
    ("path", "layout", "page_size", "v_head_dim"),
    list(itertools.product(PATHS, LAYOUTS, [1, 4], [None, 4])),
)
def test_every_copy_path_round_trips(
    path: str, layout: str, page_size: int, v_head_dim: int | None
) -> None:
    dev, host = pools(layout, page_size=page_size, v_head_dim=v_head_dim, tuning=PATHS[path])
    fill_device_random(dev, 2)
    # shuffled pages on both sides, and one contiguous run of two pages
    h = page_indices([5, 0, 7, 8], page_size)
    d = page_indices([3, 6, 1, 2], page_size)
    host.backup_from_device_all_layer(dev, h, d, "direct")
    target, _ = pools(layout, page_size=page_size, v_head_dim=v_head_dim)
    before = snapshot(target, host)
    for layer in range(dev.layer_num):
        host.load_to_device_per_layer(target, h, d, layer, "direct")
        assert torch.equal(device_rows(target, layer, d), device_rows(dev, layer, d))
    untouched = torch.tensor(sorted(set(range(target.size + page_size)) - set(d.tolist())))
    for layer in range(dev.layer_num):
        assert torch.equal(device_rows(target, layer, untouched), before[layer][untouched])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_flat_page_is_its_objects_k_then_v(layout: str) -> None:
    dev, host = pools(layout, v_head_dim=4, ratio=1.0)
    fill_device_random(dev, 3)
    idx = torch.arange(host.size)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    ps = host.page_size
    start = 2 * ps
    page = host.get_data_page(start)
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(start, start + ps))
    objects = b"".join(read_memory(p, n) for p, n in zip(ptrs, sizes, strict=True))
    assert objects == page.view(torch.uint8).numpy().tobytes()
    k_bytes = ps * 3 * 2 * 8 * 2
    assert sum(sizes[: len(sizes) // 2]) == k_bytes  # K objects first
    base, total, obj = host.get_contiguous_buf_infos()
    assert base == [host.k_buffer.data_ptr(), host.v_buffer.data_ptr()]
    assert total == [host.k_buffer.nbytes, host.v_buffer.nbytes]
    assert obj == [sizes[0], sizes[-1]]
    # a flat page written elsewhere reads back identically
    host.set_from_flat_data_page(0, page)
    assert torch.equal(host.get_data_page(0).view(torch.uint8), page.view(torch.uint8))
    assert host.get_dummy_flat_data_page().numel() == page.numel()


def test_backend_dispatches_on_the_device_pools_kind() -> None:
    backend = sgl_core.get_backend("torch")
    assert backend.supported_pairs == sgl_core.TorchBackend().supported_pairs
    assert HostLayout.PAGE_HEAD not in backend.supported_pairs
    assert set(backend.supported_mha_pairs) == {HostLayout(x) for x in LAYOUTS}
    assert backend.supported_mha_pairs == MHATokenHostPool.supported_pairs
    for layout in LAYOUTS:
        assert backend.supported_mha_pairs[HostLayout(layout)] == {IOBackend.DIRECT}
        assert backend.default_mha_io(layout) is IOBackend.DIRECT
    with pytest.raises(errors.UnsupportedLayoutError):
        backend.default_mha_io("page_first_kv_split")
    with pytest.raises(errors.UnsupportedLayoutError):
        backend.default_io("page_head")  # MLA pools have no page_head
    mla = backend.create_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=1
    )
    assert isinstance(
        backend.create_host_pool(mla, layout="layer_first"), sgl_core.backend.TokenRowHostPool
    )
    with pytest.raises(errors.UnsupportedLayoutError):
        backend.create_host_pool(mla, layout="page_head")
    mha = backend.create_mha_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=1
    )
    host = backend.create_host_pool(mha, layout="page_head")
    assert isinstance(host, sgl_core.MHAHostPool) and isinstance(host, MHATokenHostPool)
    assert (host.head_num, host.head_dim, host.v_head_dim) == (1, 8, 8)


def test_backend_without_mha_pools_says_so() -> None:
    class MLAOnly(
        sgl_core.backend.PoolBackend[
            sgl_core.backend.PerLayerMLADevicePool, sgl_core.backend.TokenRowHostPool
        ]
    ):
        name = "mla-only"

    backend = MLAOnly(sgl_core.backend.PerLayerMLADevicePool, sgl_core.backend.TokenRowHostPool)
    assert backend.supported_mha_pairs == {}
    with pytest.raises(errors.UnsupportedLayoutError, match="no MHA"):
        backend.create_mha_device_pool(
            size=8, page_size=4, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=1
        )
    mha, _ = pools("layer_first")
    with pytest.raises(errors.UnsupportedLayoutError, match="no MHA"):
        backend.create_host_pool(mha, layout="layer_first")


def test_host_pool_rejects_other_kinds_and_shapes_with_nothing_changed() -> None:
    dev, host = pools("page_first", v_head_dim=4)
    fill_device_random(dev, 4)
    idx = page_indices([1], 4)
    backend = sgl_core.TorchBackend()
    mla = backend.create_device_pool(
        size=24, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=3
    )
    others: list[object] = [
        mla,
        pools("page_first")[0],  # v_head_dim differs
        backend.create_mha_device_pool(
            size=24,
            page_size=4,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=8,
            layer_num=3,
            v_head_dim=4,
        ),
        pools("page_first", v_head_dim=4, dtype=torch.float16)[0],
        pools("page_first", v_head_dim=4, page_size=2)[0],
    ]
    before = snapshot(dev, host)
    for other in others:
        with pytest.raises(errors.PoolMismatchError):
            host.backup_from_device_all_layer(other, idx, idx, "direct")  # type: ignore[arg-type]
        with pytest.raises(errors.PoolMismatchError):
            host.load_to_device_per_layer(other, idx, idx, 0, "direct")  # type: ignore[arg-type]
    # a layer tensor of the wrong shape is refused as well
    dev.v_buffer[2] = torch.zeros(28, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(errors.PoolMismatchError, match="v_buffer"):
        host.backup_from_device_all_layer(dev, idx, idx, "direct")
    dev.v_buffer[2] = torch.zeros(28, 2, 4, dtype=torch.bfloat16)
    before[2] = device_rows(dev, 2, torch.arange(28))
    assert same_bytes(snapshot(dev, host), before)
    with pytest.raises(errors.PoolMismatchError):
        sgl_core.backend.MHATokenHostPool(mla, layout="page_first")  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", ["page_first_direct", "page_head"])
def test_page_granular_layouts_take_whole_pages_only(layout: str) -> None:
    dev, host = pools(layout)
    assert host.moves_whole_pages("direct")
    fill_device_random(dev, 5)
    before = snapshot(dev, host)
    partial = torch.tensor([4, 5, 6])
    with pytest.raises(errors.PageAlignmentError):
        host.backup_from_device_all_layer(dev, partial, partial, "direct")
    shifted = torch.arange(5, 9)
    with pytest.raises(errors.PageAlignmentError):
        host.load_to_device_per_layer(dev, shifted, torch.arange(4, 8), 0, "direct")
    assert same_bytes(snapshot(dev, host), before)


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_token_layouts_move_partial_pages(layout: str) -> None:
    dev, host = pools(layout)
    assert not host.moves_whole_pages("direct")
    fill_device_random(dev, 6)
    h, d = torch.tensor([9, 3, 4]), torch.tensor([1, 22, 7])
    host.backup_from_device_all_layer(dev, h, d, "direct")
    target, _ = pools(layout)
    for layer in range(3):
        host.load_to_device_per_layer(target, h, d, layer, "direct")
        assert torch.equal(device_rows(target, layer, d), device_rows(dev, layer, d))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float32])
def test_other_element_types_move_bit_exact(dtype: torch.dtype) -> None:
    for layout in LAYOUTS:
        dev, host = pools(layout, dtype=dtype)
        fill_device_random(dev, 7)
        idx = page_indices([2, 0], 4)
        host.backup_from_device_all_layer(dev, idx, idx, "direct")
        target, _ = pools(layout, dtype=dtype)
        for layer in range(3):
            host.load_to_device_per_layer(target, idx, idx, layer, "direct")
            assert torch.equal(device_rows(target, layer, idx), device_rows(dev, layer, idx))


class _EngineMHAPool:
    """SGLang's ``MHATokenToKVPool`` as our host pools see it: ``device`` is a str."""

    def __init__(self, layer_num: int = 2) -> None:
        self.size, self.page_size, self.layer_num = 8, 4, layer_num
        self.head_num, self.head_dim, self.v_head_dim = 2, 8, 8
        self.dtype, self.device = torch.bfloat16, "cpu"
        self.k_buffer = [torch.randn(12, 2, 8).bfloat16() for _ in range(layer_num)]
        self.v_buffer = [torch.randn(12, 2, 8).bfloat16() for _ in range(layer_num)]


def test_an_engines_own_mha_pool_is_accepted() -> None:
    from sgl_core.kv.device._engine_views import as_mha_device_pool

    engine = _EngineMHAPool()
    host = sgl_core.TorchBackend().create_host_pool(engine, layout="page_head")  # type: ignore[call-overload]
    assert isinstance(host, MHATokenHostPool)
    view = as_mha_device_pool(engine)
    assert view is as_mha_device_pool(engine) and view.device == torch.device("cpu")
    assert isinstance(view, sgl_core.MHADevicePool)
    idx = page_indices([1], 4)
    host.backup_from_device_all_layer(view, idx, idx, "direct")
    for layer in range(2):
        engine.k_buffer[layer][idx] = 0
        host.load_to_device_per_layer(view, idx, idx, layer, "direct")
    k, v = view.get_kv_buffer(1, idx)
    assert torch.equal(v, engine.v_buffer[1][idx])
    assert torch.equal(k, engine.k_buffer[1][idx]) and bool(k.any())
    # the engine's HND layout (another k_buffer shape) is refused, with nothing moved
    engine.k_buffer = [t.view(12, 8, 2) for t in engine.k_buffer]
    with pytest.raises(errors.PoolMismatchError):
        host.backup_from_device_all_layer(as_mha_device_pool(engine), idx, idx, "direct")
    with pytest.raises(errors.PoolMismatchError):
        as_mha_device_pool(object())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layer_views_are_the_pools_memory(layout: str) -> None:
    dev, host = pools(layout)
    fill_device_random(dev, 8)
    idx = page_indices([0, 2], 4)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    views = host.layer_views(dev, 1)
    assert isinstance(host, sgl_core.backend.LayerViews)
    assert len(views) == (4 if layout == "page_head" else 2)
    for rows, pages in views:
        assert rows.dim() == 2 and pages.shape[:2] == (host.page_num, host.page_size)
        assert rows.shape[1] == pages.shape[2]
        for t in idx.tolist():
            assert torch.equal(pages[t // 4, t % 4].view(torch.int16), rows[t].view(torch.int16))
    rows, pages = views[-1]  # V (of the last head): a view, writes land in the host pool
    pages[5].fill_(3)
    assert bool((host.get_data_page(20).float() == 3).any())
    with pytest.raises(errors.LayerIndexError):
        host.layer_views(dev, 3)


def test_every_geometry_and_storage_check_fires() -> None:
    backend = sgl_core.TorchBackend()
    good = {"size": 8, "page_size": 4, "dtype": torch.bfloat16, "head_num": 2, "head_dim": 8}
    for name, value, error in (
        ("head_num", 0, errors.PoolSizeError),
        ("head_dim", True, errors.PoolSizeError),
        ("v_head_dim", -4, errors.PoolSizeError),
        ("layer_num", 2.0, errors.PoolSizeError),
        ("dtype", "bf16", errors.ArgumentTypeError),
        ("size", 6, errors.PoolSizeError),
    ):
        args: dict[str, object] = {**good, "layer_num": 2, name: value}
        with pytest.raises(error):
            backend.create_mha_device_pool(**args)  # type: ignore[arg-type]
    dev, host = pools("layer_first")
    idx = page_indices([1], 4)
    before = snapshot(dev, host)
    dev.k_buffer[1] = "not a tensor"  # type: ignore[call-overload]
    with pytest.raises(errors.PoolMismatchError, match=r"not a torch\.Tensor"):
        host.backup_from_device_all_layer(dev, idx, idx, "direct")
    dev.k_buffer[1] = torch.zeros(28, 2, 8, dtype=torch.bfloat16)
    dev.k_buffer[1].untyped_storage().resize_(64)  # shape claims bytes no longer there
    with pytest.raises(errors.PoolMismatchError, match="past the end"):
        host.load_to_device_per_layer(dev, idx, idx, 1, "direct")
    dev.k_buffer = tuple(dev.k_buffer)  # type: ignore[assignment]
    with pytest.raises(errors.PoolMismatchError, match="k_buffer/v_buffer"):
        host.backup_from_device_all_layer(dev, idx, idx, "direct")
    assert same_bytes(snapshot(pools("layer_first")[0], host)[3:], before[3:])
    _, split = pools("page_first", v_head_dim=4)
    assert split.get_data_page(0).numel() == 4 * 3 * 2 * (8 + 4)
    with pytest.raises(errors.PoolMismatchError, match="flat=False"):
        split.get_data_page(0, flat=False)
    _, same = pools("page_first")
    assert same.get_data_page(4, flat=False).shape == (2, 4, 3, 2, 8)


def test_engine_pool_view_checks_layer_ids() -> None:
    from sgl_core.kv.device._engine_views import as_mha_device_pool

    view = as_mha_device_pool(_EngineMHAPool())
    loc = torch.tensor([1])
    for bad in (2, -1, True):
        with pytest.raises(errors.PoolMismatchError):
            view.get_kv_buffer(bad, loc)
    k = torch.ones(1, 2, 8).bfloat16()
    view.set_kv_buffer(1, loc, k, 2 * k)
    got_k, got_v = view.get_kv_buffer(1, loc)
    assert torch.equal(got_k, k) and torch.equal(got_v, 2 * k)
