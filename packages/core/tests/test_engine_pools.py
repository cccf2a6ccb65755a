"""An engine's own device pools (duck-typed as SGLang's; SGLang itself: tests/with_sglang).

* fp8 stored as ``uint8`` with the flavour in ``dtype``: host pools and L3
  page formats carry the flavour, so an e4m3 page is a miss for an e5m2 pool;
* a host pool's own transfers take the engine's pool (as ``create_host_pool`` does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import sgl_core
from sgl_core.l3 import FilePageStore, page_format, page_keys

PAGE, LAYERS, SLOTS = 4, 2, 36


def _rows(gen: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Random bit patterns (fp8 NaNs included) of ``shape`` and ``dtype``."""
    *lead, last = shape
    raw = torch.randint(0, 256, (*lead, last * dtype.itemsize), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


class _EngineMLAPool:
    """SGLang's MLATokenToKVPool as we read it: ``device`` a str, fp8 stored as uint8."""

    def __init__(self, dtype: torch.dtype, seed: int = 0) -> None:
        self.size, self.page_size, self.layer_num = 32, PAGE, LAYERS
        self.kv_lora_rank, self.qk_rope_head_dim, self.kv_cache_dim = 8, 4, 12
        self.dtype, self.device = dtype, "cpu"
        self.store_dtype = torch.uint8 if dtype.itemsize == 1 else dtype
        gen = torch.Generator().manual_seed(seed)
        self.kv_buffer = [_rows(gen, self.store_dtype, SLOTS, 1, 12) for _ in range(LAYERS)]


class _EngineMHAPool:
    """SGLang's MHATokenToKVPool as we read it (NHD), fp8 stored as uint8."""

    def __init__(self, dtype: torch.dtype, seed: int = 0) -> None:
        self.size, self.page_size, self.layer_num = 32, PAGE, LAYERS
        self.head_num, self.head_dim, self.v_head_dim = 2, 8, 8
        self.dtype, self.device = dtype, "cpu"
        self.store_dtype = torch.uint8 if dtype.itemsize == 1 else dtype
        gen = torch.Generator().manual_seed(seed)
        self.k_buffer = [_rows(gen, self.store_dtype, SLOTS, 2, 8) for _ in range(LAYERS)]
        self.v_buffer = [_rows(gen, self.store_dtype, SLOTS, 2, 8) for _ in range(LAYERS)]


def _engine(kind: str, dtype: torch.dtype, seed: int = 0) -> _EngineMLAPool | _EngineMHAPool:
    return _EngineMLAPool(dtype, seed) if kind == "mla" else _EngineMHAPool(dtype, seed)


def _layers(engine: _EngineMLAPool | _EngineMHAPool) -> list[torch.Tensor]:
    if isinstance(engine, _EngineMLAPool):
        return engine.kv_buffer
    return engine.k_buffer + engine.v_buffer


def _pairs(kind: str) -> list[tuple[str, str]]:
    backend = sgl_core.get_backend("torch")
    pairs = backend.supported_pairs if kind == "mla" else backend.supported_mha_pairs
    return [(layout.value, io.value) for layout, ios in pairs.items() for io in sorted(ios)]


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_fp8_flavours_of_an_engines_pool_do_not_share_pages(kind: str, tmp_path: Path) -> None:
    backend = sgl_core.get_backend("torch")
    idx = torch.arange(PAGE, 3 * PAGE)
    keys = page_keys(list(range(2 * PAGE)), PAGE)
    for layout, io in _pairs(kind):
        e4m3 = _engine(kind, torch.float8_e4m3fn)
        e5m2 = _engine(kind, torch.float8_e5m2)  # the very same stored bytes
        writer = backend.create_host_pool(e4m3, layout=layout)  # type: ignore[call-overload]
        reader = backend.create_host_pool(e5m2, layout=layout)  # type: ignore[call-overload]
        assert (writer.dtype, reader.dtype) == (torch.float8_e4m3fn, torch.float8_e5m2)
        assert page_format(writer) != page_format(reader)
        writer.backup_from_device_all_layer(e4m3, idx, idx, io)
        store = FilePageStore(tmp_path / kind / layout / io)
        store.register_host_pool(writer)
        assert store.batch_set(keys, idx) == [True, True]
        store.register_host_pool(reader)
        assert store.batch_exists(keys) == 0
        assert store.batch_get(keys, idx) == [False, False]
        # The same flavour still hits, byte for byte.
        same = backend.create_host_pool(_engine(kind, torch.float8_e4m3fn, 1), layout=layout)  # type: ignore[call-overload]
        store.register_host_pool(same)
        assert store.batch_exists(keys) == 2
        assert store.batch_get(keys, idx) == [True, True]
        for i in range(PAGE, 3 * PAGE, PAGE):
            got, want = same.get_data_page(i), writer.get_data_page(i)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_a_host_pools_own_transfers_take_the_engines_pool(kind: str) -> None:
    """create_host_pool took the engine's pool: so do the pool's own transfers."""
    backend = sgl_core.get_backend("torch")
    src_idx, host_idx, dst_idx = torch.arange(4, 12), torch.arange(8, 16), torch.arange(20, 28)
    for dtype in (torch.bfloat16, torch.float8_e5m2):
        for layout, io in _pairs(kind):
            src = _engine(kind, dtype, 2)
            host = backend.create_host_pool(src, layout=layout)  # type: ignore[call-overload]
            host.backup_from_device_all_layer(src, host_idx, src_idx, io)
            dst = _engine(kind, dtype, 3)
            for layer in range(LAYERS):
                host.load_to_device_per_layer(dst, host_idx, dst_idx, layer, io)
            for a, b in zip(_layers(src), _layers(dst), strict=True):
                assert a.dtype == b.dtype == src.store_dtype  # the engine's tensors, untouched
                assert torch.equal(a[src_idx].view(torch.uint8), b[dst_idx].view(torch.uint8))


def test_the_views_accessors_write_an_fp8_engines_bytes() -> None:
    from sgl_core.kv.device._engine_views import as_mha_device_pool
    from sgl_core.kv.device._foreign_pool import ForeignMLADevicePool

    gen = torch.Generator().manual_seed(5)
    loc = torch.tensor([3, 9])
    mla = _EngineMLAPool(torch.float8_e5m2)
    view = ForeignMLADevicePool(mla)
    assert view.dtype == torch.float8_e5m2 and view.kv_buffer[0].dtype == torch.float8_e5m2
    nope, rope = _rows(gen, torch.float8_e5m2, 2, 1, 8), _rows(gen, torch.float8_e5m2, 2, 1, 4)
    view.set_mla_kv_buffer(1, loc, nope, rope)
    assert torch.equal(mla.kv_buffer[1][loc], torch.cat([nope, rope], -1).view(torch.uint8))
    got = view.get_mla_kv_buffer(1, loc)
    assert all(g.dtype == torch.float8_e5m2 for g in got)
    assert torch.equal(torch.cat(got, -1).view(torch.uint8), mla.kv_buffer[1][loc])
    mha = _EngineMHAPool(torch.float8_e4m3fn)
    mview = as_mha_device_pool(mha)
    k, v = (_rows(gen, torch.float8_e4m3fn, 2, 2, 8) for _ in range(2))
    mview.set_kv_buffer(0, loc, k, v)
    assert torch.equal(mha.k_buffer[0][loc], k.view(torch.uint8))
    assert torch.equal(mha.v_buffer[0][loc], v.view(torch.uint8))
    gk, gv = mview.get_kv_buffer(0, loc)
    assert gk.dtype == gv.dtype == torch.float8_e4m3fn
    assert torch.equal(gk.view(torch.uint8), k.view(torch.uint8))


@pytest.mark.parametrize("kind", ["mla", "mha"])
@pytest.mark.parametrize("wrong", ["dtype", "shape", "other_flavour"])
def test_the_views_refuse_rows_they_would_convert(kind: str, wrong: str) -> None:
    """As our own pools: rows of another dtype (even the other fp8) or shape change nothing."""
    from sgl_core.errors import ShapeMismatchError
    from sgl_core.integrations.sglang import as_device_pool
    from sgl_core.kv.device._engine_views import as_mha_device_pool

    dtype = torch.float8_e4m3fn if wrong == "other_flavour" else torch.bfloat16
    engine = _engine(kind, dtype)
    before = [t.clone() for t in _layers(engine)]
    gen = torch.Generator().manual_seed(9)
    bad = {"dtype": torch.float32, "shape": dtype, "other_flavour": torch.float8_e5m2}[wrong]
    n = 3 if wrong == "shape" else 2
    loc = torch.tensor([3, 9])
    with pytest.raises(ShapeMismatchError):
        if isinstance(engine, _EngineMLAPool):
            as_device_pool(engine).set_mla_kv_buffer(
                1, loc, _rows(gen, bad, n, 1, 8), _rows(gen, dtype, 2, 1, 4)
            )
        else:
            as_mha_device_pool(engine).set_kv_buffer(
                1, loc, _rows(gen, dtype, 2, 2, 8), _rows(gen, bad, n, 2, 8)
            )
    now = [t.view(torch.uint8) for t in _layers(engine)]
    assert all(torch.equal(a.view(torch.uint8), b) for a, b in zip(before, now, strict=True))


def test_engine_views_refuse_pools_without_their_layer_lists() -> None:
    """An engine's pool needs its kind's per-layer lists, non-empty and equally long."""
    import types

    from sgl_core import errors
    from sgl_core.kv.device._foreign_pool import ForeignMHADevicePool, ForeignMLADevicePool

    layer = torch.zeros(4, 1, 8)
    with pytest.raises(errors.PoolMismatchError, match="not a per-layer MLA device pool"):
        ForeignMLADevicePool(types.SimpleNamespace(device="cpu"))
    with pytest.raises(errors.PoolMismatchError, match="not a per-layer MHA device pool"):
        ForeignMHADevicePool(types.SimpleNamespace(device="cpu", k_buffer=[layer]))
    for k, v in (([], []), ([layer], [layer, layer]), ((layer,), (layer,))):
        pool = types.SimpleNamespace(device="cpu", k_buffer=k, v_buffer=v)
        with pytest.raises(errors.PoolMismatchError, match="k_buffer/v_buffer must be non-empty"):
            ForeignMHADevicePool(pool)
    with pytest.raises(errors.PoolMismatchError, match="kv_buffer must be non-empty"):
        ForeignMLADevicePool(types.SimpleNamespace(device="cpu", kv_buffer=[]))
    view = ForeignMHADevicePool(
        types.SimpleNamespace(device="cpu", k_buffer=[layer], v_buffer=[layer])
    )
    assert view.device == torch.device("cpu")
