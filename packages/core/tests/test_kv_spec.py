"""The KV model: presets of ``KVSpec``, the one source of sizes and page-format identity."""

from __future__ import annotations

import pytest
import torch

import sgl_core
from sgl_core import errors
from sgl_core.backend import Component, KVKind, KVSpec, mha_spec, mla_spec


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
    "build",
    [
        lambda: mla_spec(0, 512, 64, torch.bfloat16),
        lambda: mla_spec(2, 0, 64, torch.bfloat16),
        lambda: mla_spec(2, 512, True, torch.bfloat16),
        lambda: mla_spec(2, 512, 64, torch.bfloat16, 0),
        lambda: mha_spec(2, 0, 128, 128, torch.bfloat16),
        lambda: mha_spec(2, 8, -1, 128, torch.bfloat16),
        lambda: mha_spec(2, 8, 128, 0, torch.bfloat16),
        lambda: Component("x", 0, torch.float32),
        lambda: Component("x", 4, torch.float32, heads=0),
    ],
)
def test_bad_sizes_are_pool_size_errors(build: object) -> None:
    with pytest.raises(errors.PoolSizeError):
        build()  # type: ignore[operator]


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
