"""Our INDEXER entry (``SGLangIndexerHostPool``) on SGLang's real ``DSATokenToKVPool``.

Every check before a byte moves, each refusal of the builder that replaces
``DSAIndexerHostPoolBuilder``, and the KV entry of a DSA pool holding its KV
rows only (test_sglang_dsa_stack.py runs the whole stack).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import _sglang_stack as st
import msgspec
import pytest
import torch

import sgl_core
from sgl_core.errors import (
    ArgumentTypeError,
    DuplicateIndexError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    LayerIndexError,
    PageAlignmentError,
    PoolMismatchError,
    SGLError,
    UnsupportedLayoutError,
)
from sgl_core.integrations.sglang import (
    SGLangHostPool,
    SGLangIndexerHostPool,
    indexer_host_pool_builder,
    kv_host_pool_builder,
)
from sgl_core.integrations.sglang_storage import SGLangPageStorage
from sgl_core.kv.device._foreign_pool import ForeignMLADevicePool
from sgl_core.kv.device._paged_indexer import IndexerPagesView
from sgl_core.l3 import FilePageStore, PageStoreArgumentError

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName  # isort: skip
from sglang.srt.mem_cache.hicache_storage import PoolTransfer  # isort: skip
from sglang.srt.mem_cache.pool_host.dsa import make_dsa_indexer_pool_decl  # isort: skip
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # isort: skip

PAGE, LIVE = st.DSA_PAGE, st.DSA_LIVE
ROW = PAGE * (st.DSA_KEY + 4)


def _pools(
    dev: Any, backend: str = "torch", layout: str = "page_first", **kv: Any
) -> tuple[SGLangHostPool, SGLangIndexerHostPool]:
    b = sgl_core.get_backend(backend)
    anchor = kv_host_pool_builder(b, layout=layout, **kv)(kv_pool=dev, page_size=PAGE)
    ix = indexer_host_pool_builder(b).build(
        decl=make_dsa_indexer_pool_decl(dev), anchor_host=anchor
    )
    return anchor, ix


def _fill(ix: SGLangIndexerHostPool) -> None:
    raw = torch.randint(0, 256, ix.pool.kv_buffer.shape, generator=torch.Generator().manual_seed(3))
    ix.pool.kv_buffer.copy_(raw.to(torch.uint8))


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_sglangs_buffer_is_a_view_of_our_pool(layout: str) -> None:
    dev = st.dsa()
    anchor, ix = _pools(dev, layout=layout)
    buf = ix.index_k_with_scale_buffer
    pages = anchor.size // PAGE
    shape = (2, pages, ROW) if layout == "layer_first" else (pages, 2, 1, ROW)
    assert tuple(buf.shape) == shape and buf.dtype == torch.uint8
    assert buf.data_ptr() == ix.pool.kv_buffer.data_ptr() and ix.indexer_page_num == pages
    assert ix.get_hybrid_pool_buffer() == [buf]
    assert (ix.size, ix.page_num, ix.logical_size, ix.logical_page_size) == (
        anchor.size, anchor.page_num, anchor.size, PAGE,
    )  # fmt: skip


def _ok(dev: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(PAGE, 3 * PAGE), torch.arange(2 * PAGE, 4 * PAGE)


_A, _N = torch.arange, 2 * PAGE
_BAD: dict[str, tuple[Callable[[Any, Any], tuple[Any, Any, Any]], type[SGLError]]] = {
    "host not a tensor": (lambda dev, o: (dev, list(range(_N)), o), ArgumentTypeError),
    "float indices": (lambda dev, o: (dev, _A(_N) * 1.0, o), IndexDTypeError),
    "2-D indices": (lambda dev, o: (dev, _A(_N).view(2, -1), o), IndexShapeError),
    "part of a page": (lambda dev, o: (dev, _A(PAGE - 1), o[: PAGE - 1]), PageAlignmentError),
    "unaligned run": (lambda dev, o: (dev, _A(1, _N + 1), o), PageAlignmentError),
    "run out of order": (lambda dev, o: (dev, _A(_N).flip(0), o), PageAlignmentError),
    "run with a gap": (
        lambda dev, o: (dev, torch.cat([_A(32), _A(96, 128), _A(PAGE, 2 * PAGE)]), o),
        PageAlignmentError,
    ),
    "device run unaligned": (lambda dev, o: (dev, _A(_N), o + 1), PageAlignmentError),
    "counts differ": (lambda dev, o: (dev, _A(PAGE), o), IndexShapeError),
    "duplicate pages": (
        lambda dev, o: (dev, _A(PAGE).repeat(2), o[:PAGE].repeat(2)), DuplicateIndexError,
    ),
    "host page out of range": (lambda dev, o: (dev, _A(_N) + 100 * PAGE, o), IndexOutOfRangeError),
    "device page out of range": (lambda dev, o: (dev, _A(_N), o + 8 * PAGE), IndexOutOfRangeError),
    "another device pool": (lambda dev, o: (st.dsa(seed=9), _A(_N), o), PoolMismatchError),
}  # fmt: skip


@pytest.mark.parametrize("direction", ["backup", "load"])
@pytest.mark.parametrize("case", sorted(_BAD))
def test_a_rejected_transfer_changes_no_byte(direction: str, case: str) -> None:
    dev = st.dsa()
    _, ix = _pools(dev)
    _fill(ix)
    make, error = _BAD[case]
    pool, h, d = make(dev, torch.arange(2 * PAGE, 4 * PAGE))
    before, host = st.dsa_state(dev), ix.pool.kv_buffer.clone()
    with pytest.raises(error):
        if direction == "backup":
            ix.backup_from_device_all_layer(pool, h, d, "direct")
        else:
            ix.load_to_device_per_layer(pool, h, d, 0, "direct")
    assert torch.equal(ix.pool.kv_buffer, host)
    assert all(torch.equal(a, b) for a, b in zip(st.dsa_state(dev), before, strict=True))


@pytest.mark.parametrize(
    ("layer", "draft", "error"),
    [(True, False, ArgumentTypeError), (3, False, LayerIndexError), (-1, False, LayerIndexError),
     (0, True, PoolMismatchError)],
)  # fmt: skip
def test_a_rejected_layer_changes_no_byte(layer: Any, draft: bool, error: type[SGLError]) -> None:
    dev = st.dsa()
    _, ix = _pools(dev)
    _fill(ix)
    before = st.dsa_state(dev)
    with pytest.raises(error):
        ix.load_to_device_per_layer(dev, *_ok(dev), layer, "direct", is_draft=draft)
    assert all(torch.equal(a, b) for a, b in zip(st.dsa_state(dev), before, strict=True))


@pytest.mark.parametrize(("backend", "layout", "io"), [
    ("torch", "page_first", "kernel"), ("torch", "layer_first", "direct"),
    ("cuda", "page_first", "kernel"), ("cuda", "layer_first", "kernel"),
    ("cuda", "page_first_direct", "direct"),
])  # fmt: skip
def test_per_layer_load_moves_that_layers_pages_only(backend: str, layout: str, io: str) -> None:
    dev = st.dsa()
    _, ix = _pools(dev, backend, layout)
    _fill(ix)
    h, d = _ok(dev)
    hp, dp = h[::PAGE] // PAGE, d[::PAGE] // PAGE
    before = st.dsa_state(dev)
    ix.load_to_device_per_layer(dev, h, d, 1, io)  # shared top-k: no index pages, nothing moves
    ix.load_to_device_per_layer(dev, h[:0], d[:0], 0, io)  # no pages
    assert all(torch.equal(a, b) for a, b in zip(st.dsa_state(dev), before, strict=True))
    ix.load_to_device_per_layer(dev, h, d, 2, io)
    after = st.dsa_state(dev)
    layers = st.DSA_LAYERS
    mine = ix.get_data_page(int(h[0])).view(2, ROW)  # host page 1, both indexer layers
    assert torch.equal(after[layers + 2][dp[0]], mine[1])
    assert torch.equal(after[layers + 2][dp[1]], ix.get_data_page(int(h[PAGE])).view(2, ROW)[1])
    untouched = [i for i in range(len(before)) if i != layers + 2]
    assert all(torch.equal(after[i], before[i]) for i in untouched)
    keep = [p for p in range(after[layers + 2].shape[0]) if p not in dp.tolist()]
    assert torch.equal(after[layers + 2][keep], before[layers + 2][keep])
    assert hp.tolist() == [1, 2]


def test_backup_of_no_pages_moves_nothing() -> None:
    dev = st.dsa()
    _, ix = _pools(dev)
    empty = torch.arange(0)
    ix.backup_from_device_all_layer(dev, empty, empty, "direct")
    assert not ix.pool.kv_buffer.any()


def test_page_calls() -> None:
    dev = st.dsa()
    _, ix = _pools(dev)
    _fill(ix)
    page = ix.get_data_page(torch.tensor(PAGE))  # SGLang passes 0-d tensors too
    assert page.shape == (2 * ROW,) and torch.equal(page, ix.index_k_with_scale_buffer[1].flatten())
    with pytest.raises(PageAlignmentError):
        ix.get_data_page(PAGE + 1)
    with pytest.raises(IndexOutOfRangeError):
        ix.get_data_page(ix.size)
    with pytest.raises(IndexOutOfRangeError):
        ix.get_data_page(-PAGE)
    ix.set_from_flat_data_page(0, page)
    assert torch.equal(ix.get_data_page(0), page)
    with pytest.raises(SGLError):
        ix.set_from_flat_data_page(0, page[:-1])
    assert ix.get_dummy_flat_data_page().shape == page.shape
    ptrs, sizes = ix.get_page_buffer_meta(list(range(PAGE, 3 * PAGE)))
    base = ix.index_k_with_scale_buffer.data_ptr()
    assert ptrs == [base + 2 * ROW, base + 4 * ROW] and sizes == [2 * ROW] * 2
    with pytest.raises(PageAlignmentError):
        ix.get_page_buffer_meta(list(range(1, PAGE + 1)))
    assert ix.get_page_buffer_element_size() == 2 * ROW
    with pytest.raises(UnsupportedLayoutError):
        ix.get_page_buffer_element_size(2)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_is_stride_page_aligned(layout: str) -> None:
    dev = st.dsa()
    _, ix = _pools(dev, layout=layout)
    # base 4096-aligned; page_first pages 2 * 8448 B apart, layer_first 8448 B apart
    assert ix.is_stride_page_aligned(256) and not ix.is_stride_page_aligned(4096)
    assert ix.is_stride_page_aligned(512) is (layout == "page_first")  # 8448 = 16.5 * 512
    for bad in (True, 0):
        with pytest.raises(ArgumentTypeError):
            ix.is_stride_page_aligned(bad)


def test_is_stride_page_aligned_with_one_page() -> None:
    dev = st.dsa()
    one_page_gb = 1.5 * PAGE * 656 * st.DSA_LAYERS / 1e9
    anchor, ix = _pools(dev, host_size_gb=one_page_gb)
    assert anchor.size == PAGE and ix.pool.size == 1
    assert ix.is_stride_page_aligned(4096)  # the one page starts at the aligned base


def _decl(dev: Any, **changes: Any) -> Any:
    return msgspec.structs.replace(make_dsa_indexer_pool_decl(dev), **changes)


def test_builder_refusals() -> None:
    dev = st.dsa()
    backend = sgl_core.get_backend("torch")
    builder = indexer_host_pool_builder(backend)
    assert builder() is builder  # SGLang calls DSAIndexerHostPoolBuilder()
    with pytest.raises(ArgumentTypeError):
        indexer_host_pool_builder(object())  # type: ignore[arg-type]
    anchor, _ = _pools(dev)
    decl = make_dsa_indexer_pool_decl(dev)
    with pytest.raises(PoolMismatchError, match="kv_host_pool_builder"):
        builder.build(decl=decl, anchor_host=object())
    with pytest.raises(PoolMismatchError, match="draft"):
        builder.build(decl=decl, anchor_host=anchor, packed_draft_device_pools=(dev,))
    with pytest.raises(PoolMismatchError, match="transfer page size"):
        builder.validate(decl=decl, transfer_page_size=32, packed_draft_device_pools=())
    mha = MHATokenToKVPool(
        size=256, page_size=PAGE, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=3,
        device="cpu", enable_memory_saver=False,
    )  # fmt: skip

    def info(**changes: Any) -> Any:
        return msgspec.structs.replace(decl.storage_info, **changes)

    bad = {
        "no paged indexer": _decl(dev, device_pool=mha),
        "declared indexer layers": _decl(dev, owned_device_layers=(0, 1, 2)),
        "bytes per token": _decl(dev, storage_info=info(bytes_per_token_per_layer=136)),
        "float32": _decl(dev, storage_info=info(dtype=torch.float32)),
    }
    for match, d in bad.items():
        with pytest.raises(PoolMismatchError, match=match):
            builder.build(decl=d, anchor_host=anchor)
    assert (
        builder.build(decl=_decl(dev, owned_device_layers=None), anchor_host=anchor).layer_num == 2
    )


def test_entry_refusals() -> None:
    dev = st.dsa()
    anchor, ix = _pools(dev)
    inner = ix.pool
    mha_host = sgl_core.get_backend("torch").create_host_pool(st.mha()(), layout="page_first")
    with pytest.raises(ArgumentTypeError):
        SGLangIndexerHostPool(mha_host, dev, anchor=anchor)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError):
        SGLangIndexerHostPool(inner, dev, anchor=object())  # type: ignore[arg-type]
    small, _ = _pools(dev, host_to_device_ratio=1.0)
    with pytest.raises(PoolMismatchError, match="does not follow"):
        SGLangIndexerHostPool(inner, dev, anchor=small)
    other_layout, _ = _pools(dev, layout="layer_first")
    with pytest.raises(PoolMismatchError, match="does not follow"):
        SGLangIndexerHostPool(inner, dev, anchor=other_layout)
    with pytest.raises(PoolMismatchError):  # a pool with index pages on every layer
        SGLangIndexerHostPool(inner, st.dsa(skip=[False] * 3), anchor=anchor)
    del inner.kv_buffer
    with pytest.raises(PoolMismatchError, match="kv_buffer"):
        SGLangIndexerHostPool(inner, dev, anchor=anchor)


def test_index_pages_view_refusals() -> None:
    with pytest.raises(PoolMismatchError, match="no layer"):
        IndexerPagesView(st.dsa(skip=[True, True, True]))
    dev = st.dsa()
    dev.index_key_cache.buffer[2] = dev.index_key_cache.buffer[2][:-1]
    with pytest.raises(PoolMismatchError, match="different page counts"):
        IndexerPagesView(dev)
    dev = st.dsa()
    dev.index_kpool = 2
    with pytest.raises(PoolMismatchError, match="index_kpool"):
        IndexerPagesView(dev)
    dev = st.dsa()
    dev.index_head_dim = "128"
    with pytest.raises(PoolMismatchError, match="index_head_dim"):
        IndexerPagesView(dev)
    dev = st.dsa()
    dev.quant_block_size = None
    with pytest.raises(PoolMismatchError, match="bad paged indexer"):
        IndexerPagesView(dev)


def test_the_kv_entry_of_a_dsa_pool_moves_its_kv_rows_only() -> None:
    dev = st.dsa()
    anchor, _ = _pools(dev)
    assert not hasattr(anchor.pool, "indexer_layer_ids")
    before = st.dsa_state(dev)
    h, d = torch.arange(0, 2 * PAGE), torch.arange(PAGE, 3 * PAGE)
    anchor.backup_from_device_all_layer(dev, h, d, "direct")
    for t in dev.kv_buffer + dev.index_k_with_scale_buffer:
        t.view(torch.uint8).zero_()
    anchor.load_to_device_per_layer(dev, h, d, 0, "direct")
    after = st.dsa_state(dev)
    assert torch.equal(after[0][d], before[0][d]) and not after[0][:PAGE].any()
    assert not any(t.any() for t in after[1:])  # other layers, and every index page, untouched
    with pytest.raises(PoolMismatchError):  # without the KV-rows view our pool refuses the pool
        anchor.pool.backup_from_device_all_layer(dev, h, d, "direct")
    with pytest.raises(PoolMismatchError):  # another DSA pool is not mapped to the view
        anchor.backup_from_device_all_layer(st.dsa(pages=8), h, d, "direct")
    with pytest.raises(ArgumentTypeError):
        SGLangHostPool(anchor.pool, kv_rows=IndexerPagesView(dev))  # type: ignore[arg-type]
    with pytest.raises(PoolMismatchError):  # a view of rows of another shape
        SGLangHostPool(anchor.pool, kv_rows=ForeignMLADevicePool(st.mla()))


def test_storage_checks_indexer_indices_before_any_page_moves(tmp_path: Any) -> None:
    dev = st.dsa()
    anchor, ix = _pools(dev)
    stores = {"indexer": FilePageStore(str(tmp_path / "ix"))}
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="m", extra_config=None,
    )  # fmt: skip
    storage = SGLangPageStorage(config, {}, store=FilePageStore(str(tmp_path)), pool_stores=stores)
    storage.register_mem_pool_host(anchor)
    storage.register_mem_host_pool_v2(anchor, PoolName.KV)
    storage.register_mem_host_pool_v2(ix, PoolName.INDEXER)
    keys = ["a" * 64, "b" * 64]
    good = PoolTransfer(name=PoolName.INDEXER, keys=keys, host_indices=torch.arange(2 * PAGE))
    bad = PoolTransfer(name=PoolName.INDEXER, keys=keys, host_indices=torch.arange(1, 2 * PAGE + 1))
    with pytest.raises(PageStoreArgumentError, match="indexer"):
        storage.batch_set_v2([good, bad])
    assert storage._pools["indexer"][1].stats().stored_pages == 0
    assert storage.batch_set_v2([good]) == {PoolName.INDEXER: [True, True]}
    assert storage._pools["indexer"][1].stats().stored_pages == 2
