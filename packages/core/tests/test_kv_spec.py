"""The KV model: presets of ``KVSpec``, the one source of sizes and page-format identity."""

from __future__ import annotations

import pytest
import torch

import sgl_core
from sgl_core import errors
from sgl_core.backend import Component, KVKind, KVSpec, MHAShape, MLAShape, mha_spec, mla_spec


def test_mla_preset_is_one_row_per_layer() -> None:
    spec = mla_spec(3, 512, 64, torch.bfloat16)
    assert spec.kind is KVKind.MLA and [c.name for c in spec.components] == ["kv"]
    kv = spec.component("kv")
    assert (kv.dim, kv.heads, kv.row_bytes, kv.device_name) == (576, 1, 1152, "kv_buffer")
    assert spec.token_bytes == 3 * 1152 and spec.bytes_per_page(4) == 4 * 3 * 1152
    assert spec.identity == (("kv_lora_rank", 512), ("qk_rope_head_dim", 64), ("kv_cache_dim", 576))
    assert spec.flat_page_dtype == torch.bfloat16 and spec.stacked == ()


def test_packed_mla_rows_have_their_own_width() -> None:
    spec = mla_spec(2, 512, 64, torch.uint8, 656)
    assert spec.component("kv").row_bytes == 656 and spec.value("kv_cache_dim") == 656


def test_dsa_indexer_rows_exist_on_their_layers_only() -> None:
    spec = mla_spec(
        4, 8, 4, torch.float16, index_head_dim=16, indexer_layer_ids=(1, 3), with_index_k_scale=True
    )
    keys, scales = spec.component("index_k"), spec.component("index_k_scale")
    assert (keys.slot(3), keys.slot(0), keys.rows(4)) == (1, None, 2)
    assert scales.dtype == torch.float32 and scales.row_bytes == 4
    assert spec.token_bytes == 4 * 12 * 2 + 2 * (16 * 2 + 4)
    assert spec.flat_page_dtype == torch.uint8  # mixed dtypes: a flat page is bytes
    no_scale = mla_spec(4, 8, 4, torch.float16, index_head_dim=16, indexer_layer_ids=(0,))
    assert not no_scale.has("index_k_scale") and no_scale.flat_page_dtype == torch.float16


def test_mha_preset_has_k_and_v_with_their_own_widths() -> None:
    spec = mha_spec(2, 8, 128, 64, torch.bfloat16)
    k, v = spec.component("k"), spec.component("v")
    assert (k.row_bytes, v.row_bytes) == (8 * 128 * 2, 8 * 64 * 2)
    assert spec.stacked == ("k", "v") and spec.kind is KVKind.MHA
    assert spec.identity == (("head_num", 8), ("head_dim", 128), ("v_head_dim", 64))


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: mla_spec(0, 512, 64, torch.bfloat16), "layer_num"),
        (lambda: mla_spec(2, 0, 64, torch.bfloat16), "kv_lora_rank"),
        (lambda: mla_spec(2, 512, True, torch.bfloat16), "qk_rope_head_dim"),
        (lambda: mla_spec(2, 512, 64, torch.bfloat16, 0), "kv_cache_dim"),
        (lambda: mha_spec(2, 0, 128, 128, torch.bfloat16), "head_num"),
        (lambda: mha_spec(2, 8, -1, 128, torch.bfloat16), "head_dim"),
        (lambda: mha_spec(2, 8, 128, 0, torch.bfloat16), "v_head_dim"),
        (lambda: mha_spec(0, 8, 128, 128, torch.bfloat16), "layer_num"),
        (lambda: Component("x", 0, torch.float32), "x dim"),
        (lambda: Component("x", 4, torch.float32, heads=0), "x heads"),
        (lambda: MLAShape(2, 512, 64, torch.bfloat16, True), "kv_cache_dim"),
        (lambda: MLAShape(True, 512, 64, torch.bfloat16), "layer_num"),
        (lambda: MHAShape(2, 8, 0, 128, torch.bfloat16), "head_dim"),
    ],
)
def test_bad_sizes_are_pool_size_errors_naming_the_field(build: object, field: str) -> None:
    with pytest.raises(errors.PoolSizeError, match=f"^{field} must be a positive int"):
        build()  # type: ignore[operator]


def test_a_row_as_wide_as_the_split_is_the_plain_row() -> None:
    assert MLAShape(2, 512, 64, torch.bfloat16, 576).row_dim is None
    assert MLAShape(2, 512, 64, torch.uint8, 656).kv_cache_dim == 656


def test_a_component_needs_a_torch_dtype() -> None:
    with pytest.raises(errors.ArgumentTypeError):
        Component("x", 4, "float32")  # type: ignore[arg-type]


def test_indexer_layers_must_be_model_layers() -> None:
    for ids in ((4,), (-1,), (True,)):
        with pytest.raises(errors.LayerIndexError):
            mla_spec(4, 8, 4, torch.float16, index_head_dim=16, indexer_layer_ids=ids)


def test_a_spec_needs_unique_named_components() -> None:
    kv = Component("kv", 4, torch.float16)
    with pytest.raises(errors.PoolSizeError, match="unique"):
        KVSpec(KVKind.MLA, 2, torch.float16, (kv, kv), ())
    with pytest.raises(errors.PoolSizeError, match="at least one"):
        KVSpec(KVKind.MLA, 2, torch.float16, (), ())
    with pytest.raises(errors.PoolSizeError):
        KVSpec(KVKind.MLA, 0, torch.float16, (kv,), ())
    with pytest.raises(KeyError):
        mla_spec(2, 4, 4, torch.float16).component("k")


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_host_pools_are_sized_and_named_by_their_spec(kind: str) -> None:
    backend = sgl_core.TorchBackend()
    if kind == "mla":
        dev = backend.create_device_pool(
            size=8, page_size=4, dtype=torch.float16, kv_lora_rank=8, qk_rope_head_dim=4,
            layer_num=3, index_head_dim=16, indexer_layer_ids=(2,), with_index_k_scale=True,
        )  # fmt: skip
        host = backend.create_host_pool(dev, layout="page_first", host_to_device_ratio=2.0)
    else:
        dev = backend.create_mha_device_pool(
            size=8, page_size=4, dtype=torch.float16, head_num=2, head_dim=8, layer_num=3,
            v_head_dim=4,
        )  # fmt: skip
        host = backend.create_host_pool(dev, layout="page_head", host_to_device_ratio=2.0)
    spec = host.spec  # type: ignore[union-attr]
    for comp in spec.components:
        buffer = getattr(host, comp.device_name)
        assert buffer.dtype == comp.dtype
        assert buffer.numel() == host.size * comp.rows(spec.layer_num) * comp.elements
    nbytes = sum(getattr(host, c.device_name).numel() * c.itemsize for c in spec.components)
    assert nbytes == host.size * spec.token_bytes
    itemsize = torch.empty((), dtype=spec.flat_page_dtype).element_size()
    assert host.get_dummy_flat_data_page().numel() * itemsize == spec.bytes_per_page(4)


@pytest.mark.parametrize("value", [0, True])
def test_an_indexer_needs_a_positive_int_head_dim(value: object) -> None:
    with pytest.raises(errors.PoolSizeError, match="index_head_dim must be a positive int"):
        sgl_core.TorchBackend().create_device_pool(
            size=8, page_size=4, dtype=torch.float16, kv_lora_rank=8, qk_rope_head_dim=4,
            layer_num=2, index_head_dim=value,  # type: ignore[arg-type]
        )  # fmt: skip


def test_a_device_pool_of_the_other_kind_is_named_in_the_refusal() -> None:
    backend = sgl_core.TorchBackend()
    mla = backend.create_device_pool(
        size=8, page_size=4, dtype=torch.float16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )
    mha = backend.create_mha_device_pool(
        size=8, page_size=4, dtype=torch.float16, head_num=2, head_dim=8, layer_num=2
    )
    mla_host = backend.create_host_pool(mla, layout="layer_first")
    mha_host = backend.create_host_pool(mha, layout="layer_first")
    idx = torch.arange(4)
    with pytest.raises(errors.PoolMismatchError, match="not an MHA device pool"):
        mha_host.backup_from_device_all_layer(mla, idx, idx, "direct")  # type: ignore[arg-type]
    with pytest.raises(errors.PoolMismatchError, match="not an MLA device pool"):
        mla_host.backup_from_device_all_layer(mha, idx, idx, "direct")  # type: ignore[arg-type]


def test_a_pool_with_the_numbers_but_no_layer_lists_is_refused() -> None:
    """Identity alone is not enough: the per-layer tensors of every component must be there."""
    import types

    backend = sgl_core.TorchBackend()
    dev = backend.create_device_pool(
        size=8, page_size=4, dtype=torch.float16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )
    host = backend.create_host_pool(dev, layout="layer_first")
    numbers = {n: getattr(dev, n) for n in ("size", "page_size", "layer_num", "dtype", "device")}
    fake = types.SimpleNamespace(**numbers, kv_lora_rank=8, qk_rope_head_dim=4, kv_cache_dim=12)
    idx = torch.arange(4)
    with pytest.raises(errors.PoolMismatchError, match="no per-layer kv_buffer list"):
        host.backup_from_device_all_layer(fake, idx, idx, "direct")  # type: ignore[arg-type]


def test_pages_of_one_component_and_of_mixed_components() -> None:
    """One component: ``flat=False`` is the page as the layout keeps it. Three components
    of two dtypes (MLA rows, indexer keys, fp32 scales): the flat page is bytes and a
    round trip through it restores every part exactly; a page of the pool's dtype is refused."""
    backend = sgl_core.TorchBackend()
    plain = backend.create_device_pool(
        size=8, page_size=4, dtype=torch.float16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )
    host = backend.create_host_pool(plain, layout="layer_first")
    host.kv_buffer.copy_(torch.randn(host.kv_buffer.shape, dtype=torch.float16))  # type: ignore[union-attr]
    page = host.get_data_page(4, flat=False)
    assert page.shape == (2, 4, 1, 12) and torch.equal(page, host.kv_buffer[:, 4:8])  # type: ignore[index]
    flat_page = host.get_data_page(4)
    assert flat_page.dim() == 1 and torch.equal(flat_page.view(page.shape), page)
    dsa = backend.create_device_pool(
        size=8, page_size=4, dtype=torch.float16, kv_lora_rank=8, qk_rope_head_dim=4,
        layer_num=3, index_head_dim=16, indexer_layer_ids=(0, 2), with_index_k_scale=True,
    )  # fmt: skip
    src = backend.create_host_pool(dsa, layout="page_first")
    dst = backend.create_host_pool(dsa, layout="page_first")
    for name in ("kv_buffer", "index_k_buffer", "index_k_scale_buffer"):
        buf = getattr(src, name)
        buf.copy_(torch.randn(buf.shape).to(buf.dtype))
    flat = src.get_data_page(4)
    assert flat.dtype == torch.uint8
    dst.set_from_flat_data_page(4, flat)
    for name in ("kv_buffer", "index_k_buffer", "index_k_scale_buffer"):
        assert torch.equal(getattr(dst, name)[4:8], getattr(src, name)[4:8]), name
        assert not getattr(dst, name)[:4].any(), name
    as_pool_dtype = torch.zeros(flat.numel() // 2, dtype=torch.float16)
    with pytest.raises(errors.ShapeMismatchError):
        dst.set_from_flat_data_page(0, torch.zeros(src.flat_page_numel, dtype=torch.float16))
    with pytest.raises(errors.ShapeMismatchError):
        dst.set_from_flat_data_page(0, as_pool_dtype)
