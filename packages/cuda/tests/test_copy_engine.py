"""The batched copy-engine path's CPU side: piece arrays, merging, the ctypes call.

The address arrays are checked by replaying them as byte copies inside one CPU
buffer against a torch reference of the same transfer; the ctypes argument
lists of CUDA 12.8 (with ``failIdx``) and 13 (without) against a fake runtime.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

import pytest
import torch

from sgl_core.errors import ShapeMismatchError
from sgl_cuda import _copy_engine, _cudart, _path_choice


def replay(
    buf: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, size: torch.Tensor, base: int
) -> None:
    """Do the copies the arrays describe, addresses relative to ``base`` in ``buf`` (bytes)."""
    for s, d, n in zip(src.tolist(), dst.tolist(), size.tolist(), strict=True):
        buf[d - base : d - base + n] = buf[s - base : s - base + n].clone()


def test_token_runs() -> None:
    src = torch.tensor([4, 5, 6, 9, 1, 2], dtype=torch.int64)
    dst = torch.tensor([0, 1, 3, 4, 5, 6], dtype=torch.int64)
    s, d, n = _copy_engine.token_runs(src, dst)
    assert s.tolist() == [4, 6, 9, 1]
    assert d.tolist() == [0, 3, 4, 5]
    assert n.tolist() == [2, 1, 1, 2]
    empty = torch.empty(0, dtype=torch.int64)
    assert all(t.numel() == 0 for t in _copy_engine.token_runs(empty, empty))


def test_merge_adjacent() -> None:
    src = torch.tensor([0, 10, 20, 50, 60], dtype=torch.int64)
    dst = torch.tensor([100, 110, 125, 135, 145], dtype=torch.int64)
    size = torch.tensor([10, 10, 5, 10, 10], dtype=torch.int64)
    s, d, n = _copy_engine.merge_adjacent(src, dst, size)
    # 0+10 continues on both sides; 20 continues src of 10 but not dst (110+10 != 125);
    # 50 does not continue 20+5 on the source side; 60 continues 50 on both.
    assert s.tolist() == [0, 20, 50]
    assert d.tolist() == [100, 125, 135]
    assert n.tolist() == [20, 5, 20]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_pieces_replay_matches_torch(seed: int) -> None:
    """Layer-first pieces of a random pairing equal the indexed copy, byte for byte."""
    gen = torch.Generator().manual_seed(seed)
    layers, slots, row = 3, 40, 16
    buf = torch.randint(0, 256, (2 * layers * slots * row,), dtype=torch.uint8, generator=gen)
    base = 1 << 20  # fake addresses: offsets into ``buf`` plus a base
    src_bases = torch.tensor([base + i * slots * row for i in range(layers)])
    dst_bases = src_bases + layers * slots * row
    pages = torch.randperm(slots // 4, generator=gen)[:6]
    src_idx = (pages[:, None] * 4 + torch.arange(4)).flatten()
    dst_idx = torch.randperm(slots, generator=gen)[: src_idx.numel()].sort().values
    expected = buf.clone().view(2, layers, slots, row)
    expected[1][:, dst_idx] = expected[0][:, src_idx]
    runs = _copy_engine.token_runs(src_idx, dst_idx)
    src, dst, size = _copy_engine.layer_pieces(src_bases, dst_bases, runs, row)
    assert int(size.sum()) == layers * src_idx.numel() * row
    replay(buf, src, dst, size, base)
    assert torch.equal(buf.view(2, layers, slots, row), expected)


def test_layer_pieces_merge_contiguous_layers() -> None:
    """Consecutive layers that are contiguous on both sides become one piece."""
    row, slots = 8, 4
    src_bases = torch.tensor([0, slots * row])
    dst_bases = torch.tensor([1000, 1000 + slots * row])
    idx = torch.arange(slots)
    src, dst, size = _copy_engine.layer_pieces(
        src_bases, dst_bases, _copy_engine.token_runs(idx, idx), row
    )
    assert src.tolist() == [0] and dst.tolist() == [1000] and size.tolist() == [2 * slots * row]


def test_page_pieces_replay_matches_torch() -> None:
    """(page, layer) pieces of a page-first-direct host buffer equal the slice copies."""
    gen = torch.Generator().manual_seed(5)
    pages_n, layers, ps, row = 6, 3, 4, 8
    host = torch.randint(0, 256, (pages_n, layers, ps, row), dtype=torch.uint8, generator=gen)
    dev = torch.zeros(layers, 5 * ps, row, dtype=torch.uint8)
    host_pages = torch.tensor([4, 0, 5])
    dev_pages = torch.tensor([1, 3, 0])
    host_idx = (host_pages[:, None] * ps + torch.arange(ps)).flatten()
    dev_idx = (dev_pages[:, None] * ps + torch.arange(ps)).flatten()
    buf = torch.cat([host.flatten(), dev.flatten()])
    dev_base = host.numel()
    layer_ids = torch.tensor([2, 0])  # device layer j holds host layer layer_ids[j]
    pages = host_idx[::ps] // ps
    host_addr = pages[:, None] * (layers * ps * row) + layer_ids[None, :] * (ps * row)
    dev_bases = torch.tensor([dev_base, dev_base + 5 * ps * row])
    h, d, size = _copy_engine.page_pieces(host_addr, dev_bases, dev_idx[::ps], row, ps * row)
    replay(buf, h, d, size, 0)
    got = buf[dev_base:].view(layers, 5 * ps, row)
    expected = dev.clone()
    for j, layer in enumerate(layer_ids.tolist()):
        expected[j][dev_idx] = host[host_pages, layer].reshape(-1, row)
    assert torch.equal(got, expected)


def test_resolve_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGL_CUDA_DIRECT_COPY", raising=False)
    assert _path_choice.resolve_mode(None) == "foreach"
    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "batch")
    assert _path_choice.resolve_mode(None) == "batch"
    assert _path_choice.resolve_mode("batch-plain") == "batch-plain"
    with pytest.raises(ShapeMismatchError):
        _path_choice.resolve_mode("fast")


def test_cpu_tensors_fall_back() -> None:
    """CPU-only buffers never take the batched path (nothing issued, False returned)."""
    layers = [torch.zeros(8, 1, 4) for _ in range(2)]
    idx = torch.arange(8)
    assert not _copy_engine.layer_first(layers, layers, idx, idx, "batch", 0)
    host = torch.zeros(2, 2, 4, 1, 4)
    assert not _copy_engine.page_first(
        [(host, [layers[0]])], 0, idx, idx, 4, "batch", to_host=False
    )


def test_memcpy_attributes_layout() -> None:
    """``struct cudaMemcpyAttributes``: enum, two (enum, int) locations, unsigned int."""
    assert ctypes.sizeof(_cudart.MemcpyAttributes) == 24
    assert _cudart.MemcpyAttributes.flags.offset == 20
    assert _cudart.MemcpyAttributes.dstLocHint.offset == 12


class FakeLib:
    """Records the arguments of ``cudaMemcpyBatchAsync``; returns ``code``."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.calls: list[tuple[Any, ...]] = []

    def cudaMemcpyBatchAsync(self, *args: Any) -> int:
        self.calls.append(args)
        return self.code

    def cudaGetErrorString(self, code: int) -> bytes:
        return b"cudaErrorInvalidValue"


@pytest.mark.parametrize(("version", "nargs"), [(12080, 9), (12090, 9), (13000, 8)])
def test_batch_call_arguments(version: int, nargs: int) -> None:
    lib = FakeLib()
    rt = _cudart.Runtime(cast(ctypes.CDLL, lib), version)
    dsts = torch.tensor([100, 200], dtype=torch.int64)
    srcs = torch.tensor([300, 400], dtype=torch.int64)
    sizes = torch.tensor([8, 16], dtype=torch.int64)
    rt.memcpy_batch(
        dsts, srcs, sizes, 0x1234, device_index=1, src_on_device=False, dst_on_device=True
    )
    (args,) = lib.calls
    assert len(args) == nargs
    assert args[0].value == dsts.data_ptr() and args[1].value == srcs.data_ptr()
    assert args[2].value == sizes.data_ptr() and args[3].value == 2
    attr = args[4]._obj
    assert attr.srcAccessOrder == 1 and attr.flags == 1
    assert (attr.srcLocHint.type, attr.dstLocHint.type, attr.dstLocHint.id) == (2, 1, 1)
    assert args[5]._obj.value == 0 and args[6].value == 1
    assert args[-1].value == 0x1234


def test_batch_call_rejects_bad_input_and_reports_errors() -> None:
    rt = _cudart.Runtime(cast(ctypes.CDLL, FakeLib(code=1)), 13000)
    one = torch.tensor([8], dtype=torch.int64)
    kw: dict[str, Any] = {"device_index": 0, "src_on_device": True, "dst_on_device": False}
    with pytest.raises(ValueError, match="legacy"):
        rt.memcpy_batch(one, one, one, 0, **kw)
    with pytest.raises(ValueError, match="int64"):
        rt.memcpy_batch(one.int(), one, one, 7, **kw)
    with pytest.raises(ValueError, match="equal length"):
        rt.memcpy_batch(torch.tensor([8, 8]), one, one, 7, **kw)
    with pytest.raises(_cudart.BatchCopyError, match="cudaErrorInvalidValue"):
        rt.memcpy_batch(one, one, one, 7, **kw)


def test_find_libcudart_does_not_raise() -> None:
    """On a machine without CUDA this is None; with it, a library with the version call."""
    lib = _cudart.find_libcudart()
    assert lib is None or hasattr(lib, "cudaRuntimeGetVersion")


@pytest.mark.skipif(not _copy_engine.available(), reason="needs cudaMemcpyBatchAsync (CUDA 12.8+)")
@pytest.mark.parametrize("mode", ["batch", "batch-plain"])
@pytest.mark.parametrize("side", [False, True])
def test_issue_on_gpu_orders_with_the_stream(mode: str, side: bool) -> None:
    """A batch after device work on the same stream sees its result, both directions,
    on the legacy default stream (through the side stream) and on a user stream."""
    device = torch.device("cuda")
    n, piece = 64, 4096
    dev = torch.zeros(n * piece, dtype=torch.uint8, device=device)
    host = torch.zeros(n * piece, dtype=torch.uint8).pin_memory()
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(7))
    base_d, base_h = dev.data_ptr(), host.data_ptr()
    src = base_d + torch.arange(n, dtype=torch.int64) * piece
    dst = base_h + perm * piece
    size = torch.full((n,), piece, dtype=torch.int64)
    stream = torch.cuda.Stream() if side else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        dev.copy_(torch.arange(n * piece, device=device).to(torch.uint8))  # queued first
        _copy_engine._issue((src, dst, size), device, mode, (True, False))
        back = torch.empty_like(dev)
        back_dst = back.data_ptr() + torch.arange(n, dtype=torch.int64) * piece
        _copy_engine._issue((base_h + perm * piece, back_dst, size), device, mode, (False, True))
    torch.cuda.synchronize()
    expected = dev.cpu().view(n, piece)
    assert torch.equal(host.view(n, piece)[perm], expected)
    assert torch.equal(back.cpu(), dev.cpu())


def test_runtime_error_switches_batching_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing batch call falls back (False: the caller copies) and stays off, with the reason."""

    def failing(*args: Any, **kwargs: Any) -> None:
        raise _cudart.BatchCopyError("cudaMemcpyBatchAsync of 2 copies failed: test")

    monkeypatch.setattr(_copy_engine, "_issue", failing)
    monkeypatch.setattr(_copy_engine, "_disabled", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        _cudart, "runtime", lambda: _cudart.Runtime(cast(ctypes.CDLL, FakeLib()), 13000)
    )
    assert _copy_engine.available()
    one = torch.ones(1, dtype=torch.int64)
    with pytest.warns(RuntimeWarning, match="switched off"):
        ok = _copy_engine._issue_or_disable(
            (one, one, one), torch.device("cuda", 0), "batch", (True, False)
        )
    assert not ok
    assert "test" in _copy_engine.disabled_reason()
    assert not _copy_engine.available()


# ----------------------------------------------------- the host pools' direct io
def _mla_pool() -> Any:
    from sgl_cuda import backend

    return backend.create_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=2
    )


def _mha_pool(v_head_dim: int) -> Any:
    from sgl_cuda import backend

    return backend.create_mha_device_pool(
        size=8, page_size=4, dtype=torch.float16, head_num=2, head_dim=4, layer_num=2,
        v_head_dim=v_head_dim,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["mla", "mha", "mha_narrow_v"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
def test_host_pools_offer_direct_transfers_to_the_copy_engine(
    kind: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``SGL_CUDA_DIRECT_COPY=batch`` both kinds' ``direct`` transfers go to the copy
    engine first, every part in one call; where it declines (here: no runtime) the
    slice copies still move every byte."""
    from sgl_cuda import backend

    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "batch")
    calls: list[tuple[str, int]] = []
    real_lf, real_pf = _copy_engine.layer_first, _copy_engine.page_first

    def layer_first(src: Any, dst: Any, *args: Any) -> bool:
        calls.append(("layer_first", len(src)))
        return real_lf(src, dst, *args)

    def page_first(parts: Any, *args: Any, **kwargs: Any) -> bool:
        calls.append(("page_first", sum(len(p[1]) for p in parts)))
        return real_pf(parts, *args, **kwargs)

    monkeypatch.setattr(_copy_engine, "layer_first", layer_first)
    monkeypatch.setattr(_copy_engine, "page_first", page_first)
    make = {"mla": _mla_pool, "mha": lambda: _mha_pool(4), "mha_narrow_v": lambda: _mha_pool(2)}
    dev, dst = make[kind](), make[kind]()
    names = ("kv_buffer",) if kind == "mla" else ("k_buffer", "v_buffer")
    gen = torch.Generator().manual_seed(3)
    for name in names:
        for t in getattr(dev, name):
            t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    host = backend.create_host_pool(dev, layout=layout, io_backend="direct")
    h, d = torch.arange(4, 8), torch.arange(0, 4)
    host.backup_from_device_all_layer(dev, h, d, "direct")
    host.load_to_device_per_layer(dst, h, d, 1, "direct")
    parts = 1 if kind == "mla" else 2
    assert calls == [(layout.removesuffix("_direct"), 2 * parts), (calls[0][0], parts)]
    for name in names:
        assert torch.equal(getattr(dst, name)[1][d], getattr(dev, name)[1][d])
