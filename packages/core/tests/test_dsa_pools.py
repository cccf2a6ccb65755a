"""DeepSeek-V3.2 rows on the torch backend: packed rows, the indexer cache, L3 pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import sgl_core
from sgl_core import HostLayout
from sgl_core.backend import MLAShape, PerLayerMLADevicePool, TokenRowHostPool
from sgl_core.errors import PoolMismatchError, PoolSizeError
from sgl_core.l3 import FilePageStore, page_format, page_keys
from sgl_core.testing import device_rows, fill_device_random, host_bytes, page_indices

PS = 4
LAYERS = 3
DSA = {"index_head_dim": 16, "indexer_layer_ids": [2, 0], "with_index_k_scale": True}


def pool(**options: Any) -> PerLayerMLADevicePool:
    opts: dict[str, Any] = {"dtype": torch.uint8, "kv_cache_dim": 656, **DSA, **options}
    dev = sgl_core.get_backend("torch").create_device_pool(
        size=6 * PS, page_size=PS, kv_lora_rank=512, qk_rope_head_dim=64, layer_num=LAYERS, **opts
    )
    assert isinstance(dev, PerLayerMLADevicePool)
    return dev


def test_shape_row_dim() -> None:
    plain = MLAShape(2, 512, 64, torch.bfloat16)
    assert plain.kv_cache_dim == 576 and not plain.packed
    packed = MLAShape(2, 512, 64, torch.uint8, 656)
    assert packed.packed and packed.token_stride_size == 656 and packed.layout_dim == 1312
    assert MLAShape(2, 512, 64, torch.uint8, 576).row_dim is None  # the split itself
    for bad in (0, -8, 1.5, True):
        with pytest.raises(PoolSizeError):
            MLAShape(2, 512, 64, torch.uint8, bad)  # type: ignore[arg-type]


def test_device_pool_buffers() -> None:
    dev = pool()
    assert dev.kv_cache_dim == 656 and dev.kv_buffer[0].shape == (7 * PS, 1, 656)
    assert dev.indexer_layer_ids == (0, 2) and dev.indexer_slot(2) == 1
    assert dev.indexer_slot(1) is None
    assert dev.index_k_buffer is not None and len(dev.index_k_buffer) == 2
    assert dev.index_k_buffer[0].shape == (7 * PS, 1, 16)
    assert dev.index_k_scale_buffer is not None
    assert dev.index_k_scale_buffer[1].dtype == torch.float32


@pytest.mark.parametrize(
    ("layout", "objects"),
    [("layer_first", LAYERS + 2 + 2), ("page_first", 3), ("page_first_direct", 3)],
)
def test_host_mirror_and_page_objects(layout: str, objects: int) -> None:
    dev = pool()
    host = sgl_core.get_backend("torch").create_host_pool(dev, layout=layout)
    assert isinstance(host, TokenRowHostPool)
    assert host.flat_page_dtype == torch.uint8
    row_bytes = LAYERS * 656 + 2 * (16 + 4)
    assert host.get_dummy_flat_data_page().numel() == PS * row_bytes
    ptrs, sizes = host.get_page_buffer_meta(page_indices([1], PS))
    assert len(ptrs) == objects and sum(sizes) == PS * row_bytes
    # Sizing counts the indexer: the same byte budget holds fewer tokens.
    small = sgl_core.get_backend("torch").create_host_pool(
        dev, layout=layout, host_size_gb=PS * row_bytes * 3 / 1e9
    )
    assert small.size == 3 * PS


def test_backup_keeps_indexer_bytes_and_l3_round_trip(tmp_path: Path) -> None:
    torch_backend = sgl_core.get_backend("torch")
    for layout in ("layer_first", "page_first", "page_first_direct"):
        src = pool()
        fill_device_random(src, 1)
        host = torch_backend.create_host_pool(src, layout=layout)
        idx = page_indices([1, 2], PS)
        host.backup_from_device_all_layer(src, idx, idx, "direct")
        store = FilePageStore(tmp_path / layout)
        store.register_host_pool(host)
        keys = page_keys(list(range(2 * PS)), PS)
        assert store.batch_set(keys, idx) == [True, True]
        # A pool of another indexer configuration (or none) misses; never a wrong hit.
        for other in (
            {"index_head_dim": None, "indexer_layer_ids": None, "with_index_k_scale": False},
            {"indexer_layer_ids": [0, 1]},
        ):
            reader = torch_backend.create_host_pool(pool(**other), layout=layout)
            store.register_host_pool(reader)
            assert store.batch_exists(keys) == 0
            assert page_format(reader) != page_format(host)
        dst_dev = pool()
        fill_device_random(dst_dev, 2)
        reader = torch_backend.create_host_pool(dst_dev, layout=layout)
        store.register_host_pool(reader)
        assert store.batch_get(keys, page_indices([3, 0], PS)) == [True, True]
        h_bytes, r_bytes = host_bytes(host), host_bytes(reader)
        assert torch.equal(h_bytes[1], r_bytes[3]) and torch.equal(h_bytes[2], r_bytes[0])
        d_idx = page_indices([4, 5], PS)
        for layer in range(LAYERS):
            reader.load_to_device_per_layer(
                dst_dev, page_indices([3, 0], PS), d_idx, layer, "direct"
            )
            assert torch.equal(device_rows(dst_dev, layer, d_idx), device_rows(src, layer, idx))


def test_replaced_indexer_tensor_is_revalidated_between_layers() -> None:
    src = pool()
    fill_device_random(src, 3)
    host = sgl_core.get_backend("torch").create_host_pool(src, layout="layer_first")
    idx = page_indices([1], PS)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    dst = pool()
    host.load_to_device_per_layer(dst, idx, idx, 0, "direct")
    assert dst.index_k_buffer is not None
    dst.index_k_buffer[1] = torch.zeros((7 * PS, 1, 8), dtype=torch.uint8)  # wrong width
    kv_before = [dst.get_kv_rows(layer, torch.arange(7 * PS)) for layer in range(LAYERS)]
    for layer in (2, 1):  # the fingerprint holds every indexer tensor: each load re-checks
        with pytest.raises(PoolMismatchError, match="index_k_buffer"):
            host.load_to_device_per_layer(dst, idx, idx, layer, "direct")
    for layer in range(LAYERS):
        assert torch.equal(dst.get_kv_rows(layer, torch.arange(7 * PS)), kv_before[layer])


def test_host_pool_of_a_packed_pool_rejects_a_plain_one() -> None:
    dev = pool(index_head_dim=None, indexer_layer_ids=None, with_index_k_scale=False)
    host = sgl_core.get_backend("torch").create_host_pool(dev, layout=HostLayout.PAGE_FIRST)
    plain = sgl_core.get_backend("torch").create_device_pool(
        size=6 * PS, page_size=PS, dtype=torch.uint8, kv_lora_rank=512, qk_rope_head_dim=64,
        layer_num=LAYERS,
    )  # fmt: skip
    idx = page_indices([1], PS)
    with pytest.raises(PoolMismatchError, match="kv_cache_dim"):
        host.backup_from_device_all_layer(plain, idx, idx, "direct")


def test_indexer_tensor_resized_in_place_is_revalidated() -> None:
    src = pool()
    host = sgl_core.get_backend("torch").create_host_pool(src, layout="page_first")
    idx = page_indices([1], PS)
    host.backup_from_device_all_layer(src, idx, idx, "direct")
    dst = pool()
    host.load_to_device_per_layer(dst, idx, idx, 0, "direct")
    assert dst.index_k_scale_buffer is not None
    # Same tensor object, new (smaller) storage: only the layer's storage signature sees it.
    dst.index_k_scale_buffer[1].set_(torch.zeros((PS, 1, 1), dtype=torch.float32))  # type: ignore[call-overload]
    with pytest.raises(PoolMismatchError, match="index_k_scale_buffer"):
        host.load_to_device_per_layer(dst, idx, idx, 2, "direct")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"indexer_layer_ids": [0, 0]}, PoolSizeError),
        ({"indexer_layer_ids": []}, PoolSizeError),
        ({"index_head_dim": True}, PoolSizeError),
        ({"index_head_dim": 0}, PoolSizeError),
        ({"index_head_dim": None, "indexer_layer_ids": None}, PoolSizeError),  # scale, no dim
        ({"with_index_k_scale": 1}, PoolSizeError),
    ],
)
def test_bad_indexer_arguments(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        pool(**options)


def test_indexer_list_of_the_wrong_length_is_a_mismatch() -> None:
    src = pool()
    host = sgl_core.get_backend("torch").create_host_pool(src, layout="layer_first")
    assert src.index_k_buffer is not None
    src.index_k_buffer = src.index_k_buffer[:1]
    idx = page_indices([1], PS)
    with pytest.raises(PoolMismatchError, match="list of 2"):
        host.backup_from_device_all_layer(src, idx, idx, "direct")


def test_a_pool_with_only_an_index_head_dim_attribute_is_mirrored_without_an_indexer() -> None:
    """An engine's own DSA pool (e.g. SGLang's) names ``index_head_dim`` but keeps its
    indexer elsewhere: its host pool mirrors the KV rows only, and transfers still run."""
    dev = pool(index_head_dim=None, indexer_layer_ids=None, with_index_k_scale=False)

    class EnginePool(PerLayerMLADevicePool):
        index_head_dim = 128

    engine = EnginePool.__new__(EnginePool)
    engine.__dict__.update(dev.__dict__)
    host = sgl_core.get_backend("torch").create_host_pool(engine, layout="page_first")
    assert not hasattr(host, "index_k_buffer")
    idx = page_indices([1], PS)
    fill_device_random(dev, 4)
    host.backup_from_device_all_layer(engine, idx, idx, "direct")
    assert torch.equal(host.get_data_page(PS).view(torch.uint8).view(PS, LAYERS, 656)[0, 0],
                       dev.get_kv_rows(0, idx[:1])[0])  # fmt: skip


def test_indexer_mover_moves_parts_first_and_maps_layers_to_slots() -> None:
    """``IndexerMover`` (kernel io and engine-paged indexers): the indexer parts move
    before the KV mover, every slot on backup, and on a per-layer load the layer's slot
    (``slot_of``), or nothing for a layer without one; without ``slot_of`` the parts
    map layers themselves and get the layer id."""
    from sgl_core.kv.host._indexer_host import IndexerMover

    calls: list[tuple[str, str, int | None]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def backup(self, transfer: object) -> None:
            calls.append((self.name, "backup", None))

        def load(self, transfer: object, layer_id: int) -> None:
            assert transfer is moved  # the same validated transfer reaches every part
            calls.append((self.name, "load", layer_id))

        def check(self, device_pool: object) -> None:
            calls.append((self.name, "check", None))

        def synchronize(self) -> None:
            calls.append((self.name, "sync", None))

    slots = {1: 0, 3: 1}
    mover = IndexerMover(Recorder("kv"), [Recorder("keys"), Recorder("scales")], slots.get)  # type: ignore[arg-type]
    moved = object()
    mover.backup(moved)  # type: ignore[arg-type]
    mover.load(moved, 3)  # type: ignore[arg-type]
    mover.load(moved, 2)  # type: ignore[arg-type]
    mover.check(object())  # type: ignore[arg-type]
    mover.synchronize()
    assert calls == [
        ("keys", "backup", None),
        ("scales", "backup", None),
        ("kv", "backup", None),
        ("keys", "load", 1),
        ("scales", "load", 1),
        ("kv", "load", 3),
        ("kv", "load", 2),
        ("kv", "check", None),
        ("kv", "sync", None),
    ]
    calls.clear()
    IndexerMover(Recorder("kv"), [Recorder("rows")], None).load(moved, 2)  # type: ignore[arg-type]
    assert calls == [("rows", "load", 2), ("kv", "load", 2)]
