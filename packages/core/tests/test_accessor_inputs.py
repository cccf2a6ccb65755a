"""Row and page accessors refuse values they cannot write as given, changing nothing.

Meta tensors as data (issue 24, item 7), rows of another dtype than the pool's
(no silent casts), shapes (``ShapeMismatchError``) and any integer as ``layer_id``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core import errors
from sgl_core.testing import fill_device_random, host_bytes, page_indices

PS = 4
N = 2 * PS
BK = sgl_core.TorchBackend()


def mla(**options: Any) -> Any:
    opts: dict[str, Any] = {"dtype": torch.bfloat16, **options}
    return BK.create_device_pool(
        size=4 * PS, page_size=PS, kv_lora_rank=16, qk_rope_head_dim=8, layer_num=3, **opts
    )


def dsa() -> Any:
    return mla(
        dtype=torch.uint8,
        kv_cache_dim=40,
        index_head_dim=8,
        indexer_layer_ids=[0, 2],
        with_index_k_scale=True,
    )


def mha() -> Any:
    return BK.create_mha_device_pool(
        size=4 * PS, page_size=PS, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=3
    )


def snapshot(*pools: object) -> list[torch.Tensor]:
    """Bytes of every buffer the pools hold (device lists and host pools)."""
    out: list[torch.Tensor] = []
    for p in pools:
        if isinstance(p, (sgl_core.backend.TokenRowHostPool,)) or hasattr(p, "get_data_page"):
            out += host_bytes(p)  # type: ignore[arg-type]
            continue
        for name in ("kv_buffer", "k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer"):
            for t in getattr(p, name, None) or []:
                out.append(t.contiguous().view(torch.uint8).clone())
    return out


def refused(
    err: type[Exception], call: Callable[[], object], *pools: object, match: str | None = None
) -> None:
    before = snapshot(*pools)
    with pytest.raises(err, match=match):
        call()
    after = snapshot(*pools)
    assert len(before) == len(after) and all(
        torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )


LOC = torch.arange(PS, 2 * PS, dtype=torch.int64)


def mla_rows(dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> tuple[Any, Any]:
    return (
        torch.ones(PS, 1, 16, dtype=dtype, device=device),
        torch.ones(PS, 1, 8, dtype=dtype, device=device),
    )


def mha_rows(dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> tuple[Any, Any]:
    return (
        torch.ones(PS, 2, 8, dtype=dtype, device=device),
        torch.ones(PS, 2, 8, dtype=dtype, device=device),
    )


def dsa_index_rows(device: str = "cpu", dtype: torch.dtype = torch.uint8) -> tuple[Any, Any]:
    return (
        torch.ones(PS, 1, 8, dtype=dtype, device=device),
        torch.ones(PS, 1, 1, dtype=torch.float32, device=device),
    )


# ------------------------------------------------------------ meta as data
def test_meta_rows_are_device_errors_on_every_device_accessor() -> None:
    dev = mla()
    fill_device_random(dev, 1)
    nope, rope = mla_rows()
    m_nope, m_rope = mla_rows(device="meta")
    refused(errors.DeviceError, lambda: dev.set_mla_kv_buffer(1, LOC, m_nope, rope), dev)
    refused(errors.DeviceError, lambda: dev.set_mla_kv_buffer(1, LOC, nope, m_rope), dev)

    mh = mha()
    k, v = mha_rows()
    mk, mv = mha_rows(device="meta")
    refused(errors.DeviceError, lambda: mh.set_kv_buffer(1, LOC, mk, v), mh)
    refused(errors.DeviceError, lambda: mh.set_kv_buffer(1, LOC, k, mv), mh)

    ds = dsa()
    fill_device_random(ds, 2)
    rows = torch.ones(PS, 40, dtype=torch.uint8, device="meta")
    refused(errors.DeviceError, lambda: ds.set_kv_rows(1, LOC, rows), ds)
    keys, scales = dsa_index_rows()
    m_keys, m_scales = dsa_index_rows(device="meta")
    refused(errors.DeviceError, lambda: ds.set_index_k_buffer(2, LOC, m_keys, scales), ds)
    refused(errors.DeviceError, lambda: ds.set_index_k_buffer(2, LOC, keys, m_scales), ds)


@pytest.mark.parametrize("kind", ["mla", "dsa", "mha"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_meta_flat_page_is_a_device_error(kind: str, layout: str) -> None:
    dev = {"mla": mla, "dsa": dsa, "mha": mha}[kind]()
    host = BK.create_host_pool(dev, layout=layout)
    idx = page_indices([0, 1], PS)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    page = host.get_dummy_flat_data_page().to("meta")
    refused(errors.DeviceError, lambda: host.set_from_flat_data_page(PS, page), host, dev)


# ------------------------------------------------------ dtype: no silent cast
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_split_rows_of_another_dtype_are_refused(dtype: torch.dtype) -> None:
    dev = mla()
    fill_device_random(dev, 3)
    nope, rope = mla_rows()
    o_nope, o_rope = mla_rows(dtype)
    for call in (
        lambda: dev.set_mla_kv_buffer(1, LOC, o_nope, rope),
        lambda: dev.set_mla_kv_buffer(1, LOC, nope, o_rope),
    ):
        refused(errors.ShapeMismatchError, call, dev, match="not converted")
    mh = mha()
    k, v = mha_rows()
    ok, ov = mha_rows(dtype)
    refused(errors.ShapeMismatchError, lambda: mh.set_kv_buffer(1, LOC, ok, v), mh)
    refused(errors.ShapeMismatchError, lambda: mh.set_kv_buffer(1, LOC, k, ov), mh)


def test_index_rows_of_another_dtype_are_refused() -> None:
    ds = dsa()
    fill_device_random(ds, 4)
    keys, scales = dsa_index_rows()
    bad_keys, _ = dsa_index_rows(dtype=torch.int64)
    refused(errors.ShapeMismatchError, lambda: ds.set_index_k_buffer(2, LOC, bad_keys, scales), ds)
    half_scales = scales.to(torch.bfloat16)
    refused(errors.ShapeMismatchError, lambda: ds.set_index_k_buffer(2, LOC, keys, half_scales), ds)


# ---------------------------------------------------------------- shapes
def test_shape_mismatch_is_shape_error_and_still_a_pool_mismatch() -> None:
    assert issubclass(errors.ShapeMismatchError, errors.PoolMismatchError)
    dev = mla()
    nope, rope = mla_rows()
    refused(errors.ShapeMismatchError, lambda: dev.set_mla_kv_buffer(1, LOC, nope[:3], rope), dev)
    mh = mha()
    k, v = mha_rows()
    refused(errors.ShapeMismatchError, lambda: mh.set_kv_buffer(1, LOC, k, v[:, :1]), mh)
    ds = dsa()
    refused(errors.ShapeMismatchError, lambda: ds.set_kv_rows(1, LOC, torch.ones(PS, 39)), ds)


# -------------------------------------------------------------- layer ids
@pytest.mark.parametrize(
    "layer", [1, np.int64(1), np.int32(1), torch.tensor(1), torch.tensor(1, dtype=torch.int32)]
)
def test_any_integer_is_a_layer_id(layer: Any) -> None:
    dev = mla()
    nope, rope = mla_rows()
    dev.set_mla_kv_buffer(layer, LOC, nope, 2 * rope)
    got_nope, got_rope = dev.get_mla_kv_buffer(layer, LOC)
    assert torch.equal(got_nope, nope) and torch.equal(got_rope, 2 * rope)
    host = BK.create_host_pool(dev, layout="layer_first")
    idx = page_indices([1], PS)
    host.backup_from_device_all_layer(dev, idx, idx, "direct")
    host.load_to_device_per_layer(dev, idx, idx, layer, "direct")


@pytest.mark.parametrize(
    "layer", [True, np.bool_(True), torch.tensor(True), 1.0, torch.tensor(1.0), "1", None]
)
def test_non_integer_layer_ids_are_refused(layer: Any) -> None:
    dev = mla()
    nope, rope = mla_rows()
    refused(errors.ArgumentTypeError, lambda: dev.set_mla_kv_buffer(layer, LOC, nope, rope), dev)


# ------------------------------------------------------ mismatch messages
def test_pool_mismatch_names_the_field_that_differs() -> None:
    host = BK.create_host_pool(mla(), layout="layer_first")
    other = mla(dtype=torch.float16)
    idx = page_indices([0], PS)
    with pytest.raises(errors.PoolMismatchError) as info:
        host.backup_from_device_all_layer(other, idx, idx, "direct")
    assert "dtype is torch.float16, expected torch.bfloat16" in str(info.value)
    assert "layer_num" not in str(info.value)
    mh_host = BK.create_host_pool(mha(), layout="layer_first")
    wide = BK.create_mha_device_pool(
        size=4 * PS, page_size=PS, dtype=torch.bfloat16, head_num=4, head_dim=8, layer_num=3
    )
    with pytest.raises(errors.PoolMismatchError, match=r"head_num is 4, expected 2$"):
        mh_host.backup_from_device_all_layer(wide, idx, idx, "direct")


# ------------------------------------------------- create_host_pool io_backend
def test_created_io_backend_is_the_default_for_transfers() -> None:
    dev = mla()
    fill_device_random(dev, 5)
    host = BK.create_host_pool(dev, layout="page_first", io_backend="direct")
    assert host.default_io_backend is sgl_core.IOBackend.DIRECT
    idx = page_indices([1, 2], PS)
    host.backup_from_device_all_layer(dev, idx, idx)  # no io given: the pool's
    twin = mla()
    for layer in range(3):
        host.load_to_device_per_layer(twin, idx, idx, layer)
        got, want = twin.kv_buffer[layer][idx], dev.kv_buffer[layer][idx]
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert host.moves_whole_pages() is host.moves_whole_pages("direct")
    # An explicit io_backend still wins (and is still checked).
    refused(
        errors.UnsupportedLayoutError,
        lambda: host.backup_from_device_all_layer(dev, idx, idx, "kernel_ascend"),
        host,
        dev,
    )


def test_no_io_backend_anywhere_is_a_typed_error() -> None:
    dev = mla()
    fill_device_random(dev, 6)
    host = BK.create_host_pool(dev, layout="layer_first")
    assert host.default_io_backend is None
    idx = page_indices([1], PS)
    refused(
        errors.ArgumentTypeError,
        lambda: host.backup_from_device_all_layer(dev, idx, idx),
        host,
        dev,
        match="io_backend",
    )
    refused(
        errors.ArgumentTypeError, lambda: host.load_to_device_per_layer(dev, idx, idx, 0), host, dev
    )


# ------------------------------------------------------------------ reprs
def test_pool_reprs_show_kind_layout_sizes_dtype_device() -> None:
    dev = mla()
    assert repr(dev) == (
        "PerLayerMLADevicePool(kind=mla, size=16, page_size=4, layer_num=3, "
        "kv_lora_rank=16, qk_rope_head_dim=8, dtype=torch.bfloat16, device=cpu)"
    )
    host = BK.create_host_pool(mha(), layout="page_first")
    assert repr(host) == (
        f"{type(host).__name__}(kind=mha, layout=page_first, size=32, page_size=4, "
        "layer_num=3, head_num=2, head_dim=8, v_head_dim=8, dtype=torch.bfloat16, "
        "device=cpu, pin_memory=False)"
    )
    assert "kv_cache_dim=40" in repr(dsa())


def test_create_device_pool_is_documented() -> None:
    doc = sgl_core.TorchBackend.create_device_pool.__doc__ or ""
    assert "padding page, page 0" in doc and "kv_cache_dim" in doc


@pytest.mark.parametrize("name", ["torch", "cuda", "ascend"])
def test_every_backend_documents_its_pool_factories(name: str) -> None:
    """The padding page and the errors, on each shipped backend's own factories."""
    if name not in sgl_core.available_backends():
        pytest.skip(f"backend {name!r} is not installed here")
    backend = sgl_core.get_backend(name)
    for factory in (backend.create_device_pool, backend.create_mha_device_pool):
        doc = " ".join((factory.__doc__ or "").split())
        assert "padding page, page 0" in doc, f"{name}.{factory.__name__}"
        assert "PoolSizeError" in doc, f"{name}.{factory.__name__}"
    doc = " ".join((backend.create_host_pool.__doc__ or "").split())
    assert "UnsupportedLayoutError" in doc and "default_io_backend" in doc


def test_the_padding_page_is_page_0_everywhere() -> None:
    """One description of the padding page (issue 28): page 0, never "one page beyond size"."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    texts = [*root.glob("packages/*/src/**/*.py"), *root.glob("docs/*.md"), root / "README.md"]
    texts = [t for t in texts if t.is_file()]
    if len(texts) < 10:
        pytest.skip("the repository's sources are not here")
    other = re.compile(
        r"padding slot|one page beyond|page beyond size|last page is .*padding", re.I
    )
    found = [f"{t.name}: {m.group(0)}" for t in texts for m in other.finditer(t.read_text("utf-8"))]
    assert not found, found
