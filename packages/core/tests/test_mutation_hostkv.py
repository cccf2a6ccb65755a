"""The MHA and indexer host code, check by check (issue #24, "Tests that notice").

Through the public calls: a device pool that differs from the host pool in
one field, one layer (K *or* V, not only the first) or one indexer tensor is
refused by a transfer with a typed error and both pools byte-identical; the
flat pages and page meta of every MHA layout are compared with bytes
computed independently from the device rows; a per-layer load moves the
indexer slot (keys and scales) of that layer only.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import sgl_core
from sgl_core import errors
from sgl_core.backend import MHATokenHostPool, PerLayerMHADevicePool
from sgl_core.testing import (
    device_rows,
    fill_device_random,
    page_indices,
    read_memory,
    same_bytes,
    snapshot,
)

PS = 4
LAYERS = 3
HEADS = 2
KD = 8
LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]


def mha_dev(**change: Any) -> PerLayerMHADevicePool:
    args: dict[str, Any] = {
        "size": 6 * PS,
        "page_size": PS,
        "dtype": torch.bfloat16,
        "head_num": HEADS,
        "head_dim": KD,
        "layer_num": LAYERS,
        "v_head_dim": 4,
        **change,
    }
    dev = sgl_core.TorchBackend().create_mha_device_pool(**args)
    assert isinstance(dev, PerLayerMHADevicePool)
    return dev


def mha_pair(
    layout: str = "layer_first", seed: int = 0, **change: Any
) -> tuple[PerLayerMHADevicePool, MHATokenHostPool]:
    dev = mha_dev(**change)
    fill_device_random(dev, seed)
    host = sgl_core.TorchBackend().create_host_pool(dev, layout=layout)
    assert isinstance(host, MHATokenHostPool)
    return dev, host


# ---------------------------------------------------------------- MHAShape
class _EnginePool:
    """An engine's own MHA pool (attributes only), as create_host_pool accepts one."""

    def __init__(self, **change: Any) -> None:
        self.size, self.page_size, self.dtype, self.device = 8, 4, torch.bfloat16, "cpu"
        self.layer_num, self.head_num, self.head_dim, self.v_head_dim = 2, 2, 8, 8
        for name, value in change.items():
            setattr(self, name, value)
        slots = self.size + self.page_size
        n = self.layer_num if isinstance(self.layer_num, int) else 2
        self.k_buffer = [torch.zeros(slots, 2, 8, dtype=torch.bfloat16) for _ in range(n)]
        self.v_buffer = [torch.zeros(slots, 2, 8, dtype=torch.bfloat16) for _ in range(n)]


@pytest.mark.parametrize("name", ["layer_num", "head_num", "head_dim", "v_head_dim"])
@pytest.mark.parametrize("value", [0, -1, True, 2.0, None])
def test_every_mha_dimension_must_be_a_positive_int(name: str, value: object) -> None:
    from sgl_core.kv._spec import MHAShape

    good: dict[str, Any] = {"layer_num": 1, "head_num": 1, "head_dim": 1, "v_head_dim": 1}
    MHAShape(**good, dtype=torch.float16)  # 1 is the smallest size
    with pytest.raises(errors.PoolSizeError, match=name):
        MHAShape(**{**good, name: value}, dtype=torch.float16)  # type: ignore[arg-type]


def test_mha_shape_dtype_and_byte_arithmetic() -> None:
    from sgl_core.kv._spec import MHAShape

    with pytest.raises(errors.ArgumentTypeError):
        MHAShape(2, 3, 5, 7, "bf16")  # type: ignore[arg-type]
    shape = MHAShape(2, 3, 5, 7, torch.float32)
    assert (shape.k_row_bytes, shape.v_row_bytes) == (60, 84)
    assert shape.token_stride_size == 144 and shape.layout_dim == 288
    assert shape.bytes_per_page(4) == 1152 and shape.bytes_per_page(1) == 288


def test_an_engine_pool_without_mha_attributes_is_a_mismatch() -> None:
    pool = _EnginePool()
    del pool.head_num
    with pytest.raises(errors.PoolMismatchError):
        sgl_core.TorchBackend().create_host_pool(pool, layout="page_head")  # type: ignore[call-overload]


# ------------------------------------------------------- check_device_pool
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("layer_num", LAYERS + 1),
        ("head_num", HEADS + 1),
        ("head_dim", KD * 2),
        ("v_head_dim", 8),
        ("dtype", torch.float16),
        ("page_size", 2 * PS),
    ],
)
def test_a_device_pool_differing_in_one_field_is_refused(field: str, value: object) -> None:
    dev, host = mha_pair("page_first", seed=1)
    other = mha_dev(**{field: value})
    fill_device_random(other, 2)
    idx = page_indices([1], PS)
    before, other_before = snapshot(dev, host), snapshot(other, host)
    with pytest.raises(errors.PoolMismatchError, match=field):
        host.backup_from_device_all_layer(other, idx, idx, "direct")
    with pytest.raises(errors.PoolMismatchError, match=field):
        host.load_to_device_per_layer(other, idx, idx, LAYERS - 1, "direct")
    assert same_bytes(before, snapshot(dev, host))
    assert same_bytes(other_before, snapshot(other, host))
    host.backup_from_device_all_layer(dev, idx, idx, "direct")  # its own pool still works


def _slots() -> int:
    return 6 * PS + PS


@pytest.mark.parametrize("component", ["k_buffer", "v_buffer"])
@pytest.mark.parametrize("layer", [0, LAYERS - 1])
@pytest.mark.parametrize(
    "bad",
    ["slots-1", "slots+1", "heads+1", "dim+1", "dtype", "not a tensor"],
)
def test_a_bad_layer_tensor_is_refused_before_any_byte_moves(
    component: str, layer: int, bad: str
) -> None:
    dev, host = mha_pair("layer_first", seed=3)
    dim = KD if component == "k_buffer" else 4
    shape = {
        "slots-1": (_slots() - 1, HEADS, dim),
        "slots+1": (_slots() + 1, HEADS, dim),
        "heads+1": (_slots(), HEADS + 1, dim),
        "dim+1": (_slots(), HEADS, dim + 1),
        "dtype": (_slots(), HEADS, dim),
    }.get(bad)
    layers = getattr(dev, component)
    kept = layers[layer]
    before = snapshot(dev, host)
    if shape is None:
        layers[layer] = kept.tolist()
    else:
        dtype = torch.float16 if bad == "dtype" else torch.bfloat16
        layers[layer] = torch.zeros(shape, dtype=dtype)
    idx = page_indices([1, 2], PS)
    # layer 0 of a list that is not a tensor fails the device pool's own check first
    named = rf"{component}\[{layer}\]" if shape is not None or layer else ""
    with pytest.raises(errors.PoolMismatchError, match=named):
        host.backup_from_device_all_layer(dev, idx, idx, "direct")
    with pytest.raises(errors.PoolMismatchError, match=named):
        host.load_to_device_per_layer(dev, idx, idx, (layer + 1) % LAYERS, "direct")
    layers[layer] = kept
    assert same_bytes(before, snapshot(dev, host))


def test_the_padding_page_counts_in_the_device_slots() -> None:
    """A layer of exactly size + page_size slots is accepted; the host copies all of them."""
    dev, host = mha_pair("layer_first", seed=4)
    last = page_indices([6], PS)  # the highest device page (slot page 0 is the padding page)
    host.backup_from_device_all_layer(dev, page_indices([0], PS), last, "direct")
    k, v = dev.get_kv_buffer(2, last)
    assert torch.equal(host.k_buffer[2, :PS].view(torch.int16), k.view(torch.int16))
    assert torch.equal(host.v_buffer[2, :PS].view(torch.int16), v.view(torch.int16))


# ----------------------------------------------------- flat pages and meta
def _expected_page(dev: PerLayerMHADevicePool, layout: str, loc: torch.Tensor) -> torch.Tensor:
    """A flat page computed from the device rows: K then V, each in the layout's order."""
    parts = []
    for layers in (dev.k_buffer, dev.v_buffer):
        t = torch.stack([layer[loc] for layer in layers])  # (L, ps, H, D)
        if layout == "page_first":
            t = t.permute(1, 0, 2, 3)
        elif layout == "page_head":
            t = t.permute(2, 1, 0, 3)
        parts.append(t.contiguous().view(torch.uint8).flatten())
    return torch.cat(parts)


def _page_bytes(host: MHATokenHostPool, start: int) -> torch.Tensor:
    return host.get_data_page(start).contiguous().view(torch.uint8)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("v_head_dim", [4, None])
def test_flat_pages_and_page_meta_are_the_documented_bytes(
    layout: str, v_head_dim: int | None
) -> None:
    dev, host = mha_pair(layout, seed=5, v_head_dim=v_head_dim)
    pages = host.size // PS
    dev_pages = [1 + p % 6 for p in range(pages)]
    host.backup_from_device_all_layer(
        dev, page_indices(list(range(pages)), PS), page_indices(dev_pages, PS), "direct"
    )
    vd = KD if v_head_dim is None else v_head_dim
    for p in (0, 1, pages - 1):
        want = _expected_page(dev, layout, page_indices([dev_pages[p]], PS))
        assert torch.equal(_page_bytes(host, p * PS), want)
        ptrs, sizes = host.get_page_buffer_meta(page_indices([p], PS))
        if layout == "layer_first":
            row_k, row_v = PS * HEADS * KD * 2, PS * HEADS * vd * 2
            assert sizes == [row_k] * LAYERS + [row_v] * LAYERS
        else:
            assert sizes == [PS * LAYERS * HEADS * KD * 2, PS * LAYERS * HEADS * vd * 2]
        got = b"".join(read_memory(ptr, n) for ptr, n in zip(ptrs, sizes, strict=True))
        assert got == bytes(want.numpy())
    if v_head_dim is None:
        stacked = host.get_data_page(PS, flat=False)
        assert torch.equal(stacked[0].flatten(), host.get_data_page(PS)[: stacked[0].numel()])
    else:
        with pytest.raises(errors.PoolMismatchError, match="flat=False"):
            host.get_data_page(PS, flat=False)
    # page meta of two pages is the two pages' meta, in order
    two = host.get_page_buffer_meta(page_indices([pages - 1, 0], PS))
    one_a = host.get_page_buffer_meta(page_indices([pages - 1], PS))
    one_b = host.get_page_buffer_meta(page_indices([0], PS))
    assert two == (one_a[0] + one_b[0], one_a[1] + one_b[1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_set_from_flat_data_page_writes_that_page_only(layout: str) -> None:
    dev, host = mha_pair(layout, seed=6)
    pages = host.size // PS
    gen = torch.Generator().manual_seed(9)
    n = host.get_dummy_flat_data_page().numel()
    assert n == PS * LAYERS * HEADS * (KD + 4)
    assert not bool(host.get_dummy_flat_data_page().any())
    flat = torch.randint(-(2**15), 2**15, (n,), dtype=torch.int16, generator=gen)
    flat = flat.view(torch.bfloat16)
    for p in (0, pages - 1):
        others = [_page_bytes(host, q * PS).clone() for q in range(pages) if q != p]
        host.set_from_flat_data_page(p * PS, flat)
        assert torch.equal(_page_bytes(host, p * PS), flat.view(torch.uint8))
        assert all(
            torch.equal(a, _page_bytes(host, q * PS))
            for a, q in zip(others, [q for q in range(pages) if q != p], strict=True)
        )
        # the page loads into the device rows the documented order says
        loc = page_indices([2], PS)
        for layer in range(LAYERS):
            host.load_to_device_per_layer(dev, page_indices([p], PS), loc, layer, "direct")
        assert torch.equal(_expected_page(dev, layout, loc), flat.view(torch.uint8))
    before = [_page_bytes(host, q * PS).clone() for q in range(pages)]
    bad_calls: list[tuple[int, torch.Tensor, type[Exception]]] = [
        (1, flat, errors.PageAlignmentError),  # not a page start
        (host.size, flat, errors.IndexOutOfRangeError),  # past the end
        (-PS, flat, errors.IndexOutOfRangeError),
        (PS, flat[:-1], errors.PoolMismatchError),
        (PS, torch.cat([flat, flat[:1]]), errors.PoolMismatchError),
    ]
    for index, data, error in bad_calls:
        with pytest.raises(error):
            host.set_from_flat_data_page(index, data)
        if data is flat:
            with pytest.raises(error):
                host.get_data_page(index)
    assert all(torch.equal(a, _page_bytes(host, q * PS)) for q, a in enumerate(before))


# ------------------------------------------------------------------ indexer
DSA = {"index_head_dim": 16, "indexer_layer_ids": [2, 0], "with_index_k_scale": True}


def dsa(**options: Any) -> Any:
    opts: dict[str, Any] = {"dtype": torch.uint8, "kv_cache_dim": 656, **DSA, **options}
    return sgl_core.get_backend("torch").create_device_pool(
        size=6 * PS, page_size=PS, kv_lora_rank=512, qk_rope_head_dim=64, layer_num=LAYERS, **opts
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"index_head_dim": -1}, errors.PoolSizeError),
        ({"index_head_dim": 2.0}, errors.PoolSizeError),
        ({"index_head_dim": False}, errors.PoolSizeError),
        ({"indexer_layer_ids": [LAYERS]}, errors.LayerIndexError),
        ({"indexer_layer_ids": [0, -LAYERS - 1]}, errors.LayerIndexError),
        ({"indexer_layer_ids": [1, 2, 1]}, errors.PoolSizeError),
        ({"with_index_k_scale": None}, errors.PoolSizeError),
        ({"index_head_dim": None, "with_index_k_scale": False}, errors.PoolSizeError),
    ],
)
def test_indexer_arguments_are_checked(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        dsa(**options)


def test_indexer_configuration_edges() -> None:
    one = dsa(index_head_dim=1, indexer_layer_ids=[LAYERS - 1], with_index_k_scale=False)
    assert (one.index_head_dim, one.indexer_layer_ids, one.has_index_k_scale) == (
        1,
        (LAYERS - 1,),
        False,
    )
    assert one.index_k_scale_buffer is None
    every = dsa(indexer_layer_ids=None)  # None: every layer
    assert every.indexer_layer_ids == tuple(range(LAYERS))
    assert [every.indexer_slot(i) for i in range(LAYERS)] == [0, 1, 2]
    none = dsa(index_head_dim=None, indexer_layer_ids=None, with_index_k_scale=False)
    assert none.indexer_layer_ids == () and none.index_head_dim is None
    assert [none.indexer_slot(i) for i in range(LAYERS)] == [None] * LAYERS
    dev = dsa()
    assert dev.indexer_layer_ids == (0, 2)  # sorted
    assert [dev.indexer_slot(i) for i in range(LAYERS)] == [0, None, 1]
    for bad in (LAYERS, -LAYERS - 1):
        with pytest.raises(errors.LayerIndexError):
            dev.indexer_slot(bad)
    with pytest.raises(errors.ArgumentTypeError):
        dev.indexer_slot(True)


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_indexer_host_buffers_and_page_bytes(scale: bool, layout: str) -> None:
    dev = dsa(with_index_k_scale=scale)
    host = sgl_core.get_backend("torch").create_host_pool(dev, layout=layout)
    size = host.size
    assert (
        host.index_k_buffer.shape
        == {
            "layer_first": (2, size, 1, 16),
            "page_first": (size, 2, 1, 16),
            "page_first_direct": (size // PS, 2, PS, 1, 16),
        }[layout]
    )
    if scale:
        assert host.index_k_scale_buffer is not None
        assert host.index_k_scale_buffer.shape[-1] == 1
        assert host.index_k_scale_buffer.dtype == torch.float32
    else:
        assert host.index_k_scale_buffer is None
    per_token = LAYERS * 656 + 2 * (16 + (4 if scale else 0))
    assert host.get_dummy_flat_data_page().numel() == PS * per_token
    small = sgl_core.get_backend("torch").create_host_pool(
        dev, layout=layout, host_size_gb=PS * per_token * 3 / 1e9
    )
    assert small.size == 3 * PS


def _indexer_rows(dev: Any, slot: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keys = dev.index_k_buffer[slot][loc].clone()
    scales = dev.index_k_scale_buffer[slot][loc].clone().view(torch.int32)
    return keys, scales


def test_a_layer_load_moves_that_layers_indexer_slot_only() -> None:
    src = dsa()
    fill_device_random(src, 11)
    host = sgl_core.get_backend("torch").create_host_pool(src, layout="page_first")
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.backup_from_device_all_layer(src, h, h, "direct")
    dst = dsa()
    fill_device_random(dst, 12)
    zero = [_indexer_rows(dst, s, d) for s in (0, 1)]
    host.load_to_device_per_layer(dst, h, d, 1, "direct")  # layer 1: no indexer
    assert all(
        torch.equal(a, b)
        for s in (0, 1)
        for a, b in zip(_indexer_rows(dst, s, d), zero[s], strict=True)
    )
    host.load_to_device_per_layer(dst, h, d, 2, "direct")  # layer 2: slot 1
    assert all(
        torch.equal(a, b)
        for a, b in zip(_indexer_rows(dst, 1, d), _indexer_rows(src, 1, h), strict=True)
    )
    assert all(torch.equal(a, b) for a, b in zip(_indexer_rows(dst, 0, d), zero[0], strict=True))
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # layer 0: slot 0
    for layer in range(LAYERS):
        assert torch.equal(device_rows(dst, layer, d), device_rows(src, layer, h))


@pytest.mark.parametrize("name", ["index_k_buffer", "index_k_scale_buffer"])
@pytest.mark.parametrize("slot", [0, 1])
@pytest.mark.parametrize("bad", ["slots-1", "slots+1", "dim+1", "dtype", "not a tensor"])
def test_a_bad_indexer_tensor_is_refused_before_any_byte_moves(
    name: str, slot: int, bad: str
) -> None:
    src = dsa()
    fill_device_random(src, 13)
    host = sgl_core.get_backend("torch").create_host_pool(src, layout="layer_first")
    dim, dtype = (16, torch.uint8) if name == "index_k_buffer" else (1, torch.float32)
    slots = 7 * PS
    tensors = getattr(src, name)
    kept = tensors[slot]
    if bad == "not a tensor":
        tensors[slot] = kept.tolist()
    else:
        shape = {
            "slots-1": (slots - 1, 1, dim),
            "slots+1": (slots + 1, 1, dim),
            "dim+1": (slots, 1, dim + 1),
            "dtype": (slots, 1, dim),
        }[bad]
        other = torch.int8 if dtype == torch.uint8 else torch.int32
        tensors[slot] = torch.zeros(shape, dtype=other if bad == "dtype" else dtype)
    before = [t.clone() for t in host.index_k_buffer], host.kv_buffer.clone()
    idx = page_indices([1, 2], PS)
    with pytest.raises(errors.PoolMismatchError, match=rf"{name}\[{slot}\]"):
        host.backup_from_device_all_layer(src, idx, idx, "direct")
    with pytest.raises(errors.PoolMismatchError, match=rf"{name}\[{slot}\]"):
        host.load_to_device_per_layer(src, idx, idx, 1, "direct")
    assert all(torch.equal(a, b) for a, b in zip(before[0], host.index_k_buffer, strict=True))
    assert torch.equal(before[1], host.kv_buffer)
    tensors[slot] = kept


def test_an_indexer_list_of_another_length_or_kind_is_refused() -> None:
    src = dsa()
    host = sgl_core.get_backend("torch").create_host_pool(src, layout="page_first")
    idx = page_indices([1], PS)
    for name in ("index_k_buffer", "index_k_scale_buffer"):
        kept = getattr(src, name)
        for bad in (kept[:1], [*kept, kept[0]], tuple(kept)):
            setattr(src, name, bad)
            with pytest.raises(errors.PoolMismatchError, match=name):
                host.backup_from_device_all_layer(src, idx, idx, "direct")
        setattr(src, name, kept)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    for other in (
        {"indexer_layer_ids": [0, 1]},
        {"index_head_dim": 8},
        {"with_index_k_scale": False},
        {"index_head_dim": None, "indexer_layer_ids": None, "with_index_k_scale": False},
    ):
        with pytest.raises(errors.PoolMismatchError, match=r"indexer|kv_cache_dim"):
            host.backup_from_device_all_layer(dsa(**other), idx, idx, "direct")


def test_mha_page_format_fields_are_the_heads() -> None:
    _, host = mha_pair("page_head")
    assert host.page_format_fields() == {
        "kv_kind": "mha",
        "head_num": HEADS,
        "head_dim": KD,
        "v_head_dim": 4,
    }
    _, other = mha_pair("page_head", v_head_dim=8)
    assert other.page_format_fields()["v_head_dim"] == 8


@pytest.mark.parametrize("component", ["k_buffer", "v_buffer"])
def test_a_layer_past_its_storage_is_named(component: str) -> None:
    dev, host = mha_pair("page_first", seed=14)
    layer = torch.zeros(_slots(), HEADS, KD if component == "k_buffer" else 4)
    layer = layer.to(torch.bfloat16)
    layer.untyped_storage().resize_(64)  # the shape claims bytes that are gone
    getattr(dev, component)[LAYERS - 1] = layer
    idx = page_indices([1], PS)
    before = snapshot(dev, host)[LAYERS:]
    with pytest.raises(
        errors.PoolMismatchError, match=rf"^device_pool\.{component}\[{LAYERS - 1}\] reaches past"
    ):
        host.backup_from_device_all_layer(dev, idx, idx, "direct")
    assert same_bytes(before, snapshot(dev, host)[LAYERS:])


def test_indexer_of_reads_only_a_whole_configuration() -> None:
    from types import SimpleNamespace

    from sgl_core.kv.device._indexer import IndexerConfig, indexer_of

    assert indexer_of(object()) is None  # no attributes at all
    assert indexer_of(SimpleNamespace(index_head_dim=16)) is None
    assert indexer_of(SimpleNamespace(indexer_layer_ids=(0,))) is None
    assert indexer_of(SimpleNamespace(index_head_dim=None, indexer_layer_ids=(0,))) is None
    assert indexer_of(SimpleNamespace(index_head_dim=16, indexer_layer_ids=[0])) is None
    assert indexer_of(SimpleNamespace(index_head_dim=16, indexer_layer_ids=())) is None
    got = indexer_of(SimpleNamespace(index_head_dim=16, indexer_layer_ids=(0, 2)))
    assert got == IndexerConfig(16, (0, 2), False)  # no has_index_k_scale: no scales
    scaled = SimpleNamespace(index_head_dim=8, indexer_layer_ids=(1,), has_index_k_scale=True)
    assert indexer_of(scaled) == IndexerConfig(8, (1,), True)


def test_indexer_bytes_per_token() -> None:
    from sgl_core.kv.device._indexer import IndexerConfig

    assert IndexerConfig(16, (0, 2), True).bytes_per_token(1) == 2 * (16 + 4)
    assert IndexerConfig(16, (0, 2), False).bytes_per_token(1) == 2 * 16
    assert IndexerConfig(16, (1,), True).bytes_per_token(2) == 32 + 4
    assert IndexerConfig(16, (0, 2), True).slot(2) == 1
    assert IndexerConfig(16, (0, 2), True).slot(1) is None


def test_indexer_row_errors_name_keys_or_scales() -> None:
    dev = dsa()
    loc = torch.tensor([1, 2])
    keys, scales = torch.zeros(2, 1, 16, dtype=torch.uint8), torch.zeros(2, 1, 1)
    before = [t.clone() for t in dev.index_k_buffer], [t.clone() for t in dev.index_k_scale_buffer]
    with pytest.raises(errors.ShapeMismatchError, match=r"^index_k must be a \(2, 1, 16\)"):
        dev.set_index_k_buffer(0, loc, keys[:, :, :15], scales)
    with pytest.raises(errors.ShapeMismatchError, match=r"^index_k_scale must be a \(2, 1, 1\)"):
        dev.set_index_k_buffer(0, loc, keys, torch.zeros(2, 1, 2))
    assert all(torch.equal(a, b) for a, b in zip(before[0], dev.index_k_buffer, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before[1], dev.index_k_scale_buffer, strict=True))


def test_check_device_indexer_returns_the_tensors_and_names_what_it_got() -> None:
    from sgl_core.kv.device._indexer import indexer_of
    from sgl_core.kv.host._indexer_host import check_device_indexer

    dev = dsa()
    cfg = indexer_of(dev)
    got = check_device_indexer(dev, cfg, torch.uint8)
    assert len(got) == 4
    want = [*dev.index_k_buffer, *dev.index_k_scale_buffer]
    assert all(a is b for a, b in zip(got, want, strict=True))
    assert check_device_indexer(dsa(index_head_dim=None, indexer_layer_ids=None,
                                    with_index_k_scale=False), None, torch.uint8) == []  # fmt: skip
    kept = dev.index_k_buffer[1]
    dev.index_k_buffer[1] = kept.tolist()
    with pytest.raises(errors.PoolMismatchError, match=r"got <class 'list'>$"):
        check_device_indexer(dev, cfg, torch.uint8)
    dev.index_k_buffer[1] = kept[:-1]
    with pytest.raises(errors.PoolMismatchError, match=r"got \(27, 1, 16\) torch\.uint8$"):
        check_device_indexer(dev, cfg, torch.uint8)
    short = torch.zeros(kept.shape, dtype=torch.uint8)
    short.untyped_storage().resize_(8)
    dev.index_k_buffer[1] = short
    with pytest.raises(
        errors.PoolMismatchError, match=r"^device_pool\.index_k_buffer\[1\] reaches past"
    ):
        check_device_indexer(dev, cfg, torch.uint8)
    dev.index_k_buffer[1] = kept
    del dev.index_k_scale_buffer  # the attribute itself missing: a mismatch, not AttributeError
    with pytest.raises(errors.PoolMismatchError, match="index_k_scale_buffer must be a list"):
        check_device_indexer(dev, cfg, torch.uint8)
