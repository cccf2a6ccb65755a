"""Every ``sgl_cuda.kvcacheio`` function against a torch reference.

Without a GPU these run on CPU tensors under ``TRITON_INTERPRET=1`` (see
conftest.py); pointer tables then hold CPU ``data_ptr()`` values. Every layer
is its own allocation, so a kernel that ignored the pointer table (or assumed
a fixed layer stride) would read or write the wrong bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from sgl_core.backend import CopyTuning, tuning_for
from sgl_core.errors import IndexDTypeError, IndexShapeError, PageAlignmentError, SGLError
from sgl_cuda import _copy_engine, _cudart, kvcacheio

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LAYERS = 3


def bits(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns (NaNs included): compare as bytes."""
    raw = torch.randint(-(2**15), 2**15 - 1, shape, dtype=torch.int64, generator=gen)
    return raw.to(torch.int16).view(dtype)


def pages(page_list: list[int], page_size: int) -> torch.Tensor:
    p = torch.tensor(page_list, dtype=torch.int64)
    return (p[:, None] * page_size + torch.arange(page_size)).flatten()


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def ptrs(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64, device=DEVICE)


@dataclass
class Buffers:
    """Device per-layer rows and the three host layouts, all random."""

    dev: list[torch.Tensor]  # LAYERS x (dev_slots, 1, dim), separate allocations
    host_lf: list[torch.Tensor]  # LAYERS x (host_slots, 1, dim), separate allocations
    host_pf: torch.Tensor  # (host_slots, LAYERS, 1, dim)
    host_pfd: torch.Tensor  # (host_pages, LAYERS, page_size, 1, dim)
    page_size: int
    dim: int
    dtype: torch.dtype

    @property
    def item(self) -> int:
        return self.dim * torch.empty((), dtype=self.dtype).element_size()

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory() if DEVICE.type == "cuda" else t


def make(page_size: int, dtype: torch.dtype, dim: int = 12, seed: int = 0) -> Buffers:
    gen = torch.Generator().manual_seed(seed)
    dev_slots, host_pages = 7 * page_size, 8
    host_slots = host_pages * page_size
    b = Buffers([], [], torch.empty(0), torch.empty(0), page_size, dim, dtype)
    b.dev = [bits((dev_slots, 1, dim), dtype, gen).to(DEVICE) for _ in range(LAYERS)]
    b.host_lf = [b.pinned(bits((host_slots, 1, dim), dtype, gen)) for _ in range(LAYERS)]
    b.host_pf = b.pinned(bits((host_slots, LAYERS, 1, dim), dtype, gen))
    b.host_pfd = b.pinned(bits((host_pages, LAYERS, page_size, 1, dim), dtype, gen))
    return b


def shuffled_pages(page_size: int, seed: int, count: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(host token indices, device token indices): disjoint, shuffled whole pages."""
    gen = torch.Generator().manual_seed(seed)
    host = torch.randperm(8, generator=gen)[:count].tolist()
    dev = torch.randperm(7, generator=gen)[:count].tolist()
    return pages(host, page_size), pages(dev, page_size)


def expect_rows(
    before: torch.Tensor, after: torch.Tensor, dst: torch.Tensor, src_rows: torch.Tensor
) -> None:
    """``after`` equals ``before`` except rows ``dst``, which equal ``src_rows`` (bytes)."""
    expected = before.clone()
    expected[dst.cpu()] = src_rows.cpu()
    assert torch.equal(raw(after), raw(expected))


DTYPES = [torch.bfloat16, torch.float16]
PAGE_SIZES = [1, 16, 64]
cases = pytest.mark.parametrize(
    ("dtype", "page_size"), [(d, p) for d in DTYPES for p in PAGE_SIZES]
)


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------- kernels
@cases
def test_per_layer_mla(dtype: torch.dtype, page_size: int) -> None:
    b = make(page_size, dtype)
    h, d = shuffled_pages(page_size, 1)
    for layer in range(LAYERS):
        before = b.dev[layer].cpu()
        kvcacheio.transfer_kv_per_layer_mla(
            b.host_lf[layer], b.dev[layer], h.to(DEVICE), d.to(DEVICE), b.item
        )
        sync()
        expect_rows(before, b.dev[layer], d, b.host_lf[layer][h])


@cases
def test_per_layer_mla_pf_lf(dtype: torch.dtype, page_size: int) -> None:
    b = make(page_size, dtype, dim=40)
    h, d = shuffled_pages(page_size, 2)
    for layer in (2, 0):
        before = b.dev[layer].cpu()
        kvcacheio.transfer_kv_per_layer_mla_pf_lf(
            b.host_pf, b.dev[layer], h.to(DEVICE), d.to(DEVICE), layer, b.item, b.item * LAYERS
        )
        sync()
        expect_rows(before, b.dev[layer], d, b.host_pf[h, layer])
    # layer 1 was not loaded
    assert not torch.equal(raw(b.dev[1][d]), raw(b.host_pf[h, 1]))


@pytest.mark.parametrize(
    ("block_r", "block_w", "num_warps", "layers_inner"),
    [(8, 4, 1, None), (4, 64, 2, True), (16, 2, 8, False)],
)
def test_launch_tunables(
    block_r: int, block_w: int, num_warps: int, layers_inner: bool | None
) -> None:
    """Any tile (masked or not), warp count and grid order moves the same bytes."""
    from sgl_cuda._triton import kvcacheio as triton_kvcacheio

    b = make(16, torch.bfloat16, dim=20)  # 5 words a row: every tile above masks or splits
    h, d = shuffled_pages(16, 3)
    h_dev, d_dev = h.to(DEVICE), d.to(DEVICE)
    words = b.item // 8
    tile = {
        "block_r": block_r,
        "block_w": block_w,
        "num_warps": num_warps,
        "layers_inner": layers_inner,
    }
    common = {"words": words, "layer_offset": 0, "src_layer_w": 0, "dst_layer_w": 0}
    before = b.dev[1].cpu()
    triton_kvcacheio.launch_copy_rows(
        b.host_lf[1],
        b.dev[1],
        h_dev,
        d_dev,
        num_layers=1,
        src_row_w=words,
        dst_row_w=words,
        src_table=False,
        dst_table=False,
        **common,
        **tile,
    )
    sync()
    expect_rows(before, b.dev[1], d, b.host_lf[1][h])
    host_before = [t.clone() for t in b.host_lf]
    triton_kvcacheio.launch_copy_rows(
        ptrs(b.dev),
        ptrs(b.host_lf),
        d_dev,
        h_dev,
        num_layers=LAYERS,
        src_row_w=words,
        dst_row_w=words,
        src_table=True,
        dst_table=True,
        **common,
        **tile,
    )
    sync()
    for layer in range(LAYERS):
        expect_rows(host_before[layer], b.host_lf[layer], h, b.dev[layer][d_dev])


@cases
def test_all_layer_mla(dtype: torch.dtype, page_size: int) -> None:
    b = make(page_size, dtype)
    h, d = shuffled_pages(page_size, 3)
    before = [t.clone() for t in b.host_lf]
    kvcacheio.transfer_kv_all_layer_mla(
        ptrs(b.dev), ptrs(b.host_lf), d.to(DEVICE), h.to(DEVICE), b.item, LAYERS
    )
    sync()
    for layer in range(LAYERS):
        expect_rows(before[layer], b.host_lf[layer], h, b.dev[layer][d.to(DEVICE)])


@cases
def test_all_layer_mla_lf_pf(dtype: torch.dtype, page_size: int) -> None:
    b = make(page_size, dtype, dim=40)
    h, d = shuffled_pages(page_size, 4)
    before = b.host_pf.clone()
    kvcacheio.transfer_kv_all_layer_mla_lf_pf(
        ptrs(b.dev), b.host_pf, d.to(DEVICE), h.to(DEVICE), b.item, b.item * LAYERS, LAYERS
    )
    sync()
    expected = before.clone()
    for layer in range(LAYERS):
        expected[h, layer] = b.dev[layer][d.to(DEVICE)].cpu()
    assert torch.equal(raw(b.host_pf), raw(expected))


def test_kernels_any_token_pairing() -> None:
    """Not pages: a random injective pairing of single tokens, both directions."""
    b = make(1, torch.bfloat16, dim=40)
    gen = torch.Generator().manual_seed(9)
    h = torch.randperm(8, generator=gen)[:5]
    d = torch.randperm(7, generator=gen)[:5]
    before = [t.clone() for t in b.host_lf]
    kvcacheio.transfer_kv_all_layer_mla(
        ptrs(b.dev), ptrs(b.host_lf), d.to(DEVICE), h.to(DEVICE), b.item, LAYERS
    )
    sync()
    for layer in range(LAYERS):
        expect_rows(before[layer], b.host_lf[layer], h, b.dev[layer][d.to(DEVICE)])


def test_wide_rows_use_several_column_chunks() -> None:
    """DeepSeek-V3 rows (512 + 64 bf16 = 144 words): unmasked column chunks."""
    b = make(1, torch.bfloat16, dim=576)
    h = torch.tensor([6, 0, 3], dtype=torch.int64)
    d = torch.tensor([2, 5, 1], dtype=torch.int64)
    before = b.host_pf.clone()
    kvcacheio.transfer_kv_all_layer_mla_lf_pf(
        ptrs(b.dev), b.host_pf, d.to(DEVICE), h.to(DEVICE), b.item, b.item * LAYERS, LAYERS
    )
    sync()
    expected = before.clone()
    for layer in range(LAYERS):
        expected[h, layer] = b.dev[layer][d.to(DEVICE)].cpu()
    assert torch.equal(raw(b.host_pf), raw(expected))


def test_empty_indices_are_a_no_op() -> None:
    b = make(1, torch.float16)
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    before = b.dev[0].clone()
    kvcacheio.transfer_kv_per_layer_mla(b.host_lf[0], b.dev[0], empty, empty, b.item)
    kvcacheio.transfer_kv_all_layer_mla(ptrs(b.host_lf), ptrs(b.dev), empty, empty, b.item, LAYERS)
    assert torch.equal(raw(before), raw(b.dev[0]))


# ---------------------------------------------------------------------- direct
@pytest.fixture(params=["slices", "gather", "batch"])
def direct_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run direct copies through run slices (threshold 0), gather/scatter (huge) and
    the batched copy engine (threshold 0; on CPU it falls back to the slices);
    ``tuning_of(mode)`` is the tuning object a test passes to pick the path."""
    batch = request.param == "batch"
    monkeypatch.setenv("SGL_CUDA_DIRECT_COPY", "batch" if batch else "foreach")
    monkeypatch.setattr(_cudart, "MAX_BATCH", 3)  # several runtime calls per transfer
    issued: list[int] = []
    real_issue = _copy_engine._issue

    def counting_issue(*args: Any, **kwargs: Any) -> None:
        issued.append(1)
        real_issue(*args, **kwargs)

    monkeypatch.setattr(_copy_engine, "_issue", counting_issue)
    yield str(request.param)
    # With the runtime's batched copy present, the batch mode must really use it.
    assert bool(issued) == (batch and _copy_engine.available())
    assert _copy_engine.disabled_reason() == ""


def tuning_of(mode: str) -> CopyTuning:
    """The device's preset (its cross-device policy too), with the gather limit pinned."""
    limit = 1 << 40 if mode == "gather" else 0
    return dataclasses.replace(tuning_for(DEVICE), gather_below_run_bytes=limit)


@cases
def test_transfer_kv_direct(dtype: torch.dtype, page_size: int, direct_mode: str) -> None:
    tuning = tuning_of(direct_mode)
    b = make(page_size, dtype)
    # pages 6, 7 -> 0, 1 are one run on both sides; 3 -> 4 and 0 -> 2 are not
    h, d = pages([6, 7, 3, 0], page_size), pages([0, 1, 4, 2], page_size)
    before = [t.clone() for t in b.host_lf]
    kvcacheio.transfer_kv_direct(b.dev, b.host_lf, d.to(DEVICE), h, page_size, tuning=tuning)
    sync()
    for layer in range(LAYERS):
        expect_rows(before[layer], b.host_lf[layer], h, b.dev[layer][d.to(DEVICE)])
    # and back, one layer
    dst_before = b.dev[1].cpu()
    src = bits(tuple(b.host_lf[1].shape), dtype, torch.Generator().manual_seed(3))
    kvcacheio.transfer_kv_direct([src], [b.dev[1]], h, d, page_size, tuning=tuning)
    sync()
    expect_rows(dst_before, b.dev[1], d, src[h])


@cases
def test_per_layer_direct_pf_lf(dtype: torch.dtype, page_size: int, direct_mode: str) -> None:
    b = make(page_size, dtype)
    hp = [5, 6, 1]  # 5, 6: consecutive on both sides -> one run
    dp = [3, 4, 0]
    h, d = pages(hp, page_size), pages(dp, page_size)
    for layer in (1, 2):
        before = b.dev[layer].cpu()
        kvcacheio.transfer_kv_per_layer_direct_pf_lf(
            [b.host_pfd], [b.dev[layer]], h, d.to(DEVICE), layer, page_size
        )
        sync()
        src = b.host_pfd[torch.tensor(hp), layer].reshape(-1, 1, b.dim)
        expect_rows(before, b.dev[layer], d, src)


@cases
def test_all_layer_direct_lf_pf(dtype: torch.dtype, page_size: int, direct_mode: str) -> None:
    b = make(page_size, dtype)
    hp = [2, 3, 7, 0]
    dp = [5, 6, 1, 2]
    h, d = pages(hp, page_size), pages(dp, page_size)
    before = b.host_pfd.clone()
    kvcacheio.transfer_kv_all_layer_direct_lf_pf(b.dev, [b.host_pfd], d.to(DEVICE), h, page_size)
    sync()
    expected = before.clone()
    for layer in range(LAYERS):
        rows = b.dev[layer][d.to(DEVICE)].cpu().view(len(hp), page_size, 1, b.dim)
        expected[torch.tensor(hp), layer] = rows
    assert torch.equal(raw(b.host_pfd), raw(expected))


def test_direct_two_components() -> None:
    """K/V form: per-layer list is ``k_layers + v_layers``, two page-first buffers."""
    ps = 4
    gen = torch.Generator().manual_seed(11)
    dev = [bits((5 * ps, 1, 8), torch.float16, gen).to(DEVICE) for _ in range(2 * LAYERS)]
    hosts = [torch.zeros(3, LAYERS, ps, 1, 8, dtype=torch.float16) for _ in range(2)]
    if DEVICE.type == "cuda":  # pinned: both components go in one batched copy
        hosts = [h.pin_memory() for h in hosts]
    d, h = pages([4, 1], ps), pages([2, 0], ps)
    kvcacheio.transfer_kv_all_layer_direct_lf_pf(dev, hosts, d.to(DEVICE), h, ps)
    sync()
    for c in range(2):
        for layer in range(LAYERS):
            got = hosts[c][[2, 0], layer].reshape(-1, 1, 8)
            assert torch.equal(raw(got), raw(dev[c * LAYERS + layer][d.to(DEVICE)]))


# ---------------------------------------------------------------------- errors
def test_item_size_must_be_multiple_of_8() -> None:
    b = make(1, torch.float16, dim=10)  # 20-byte rows
    idx = torch.arange(3, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of 8"):
        kvcacheio.transfer_kv_per_layer_mla(b.host_lf[0], b.dev[0], idx, idx, 20)
    with pytest.raises(ValueError, match="item_size"):
        kvcacheio.transfer_kv_all_layer_mla(ptrs(b.dev), ptrs(b.host_lf), idx, idx, 20, LAYERS)
    with pytest.raises(ValueError, match="src_layout_dim"):
        kvcacheio.transfer_kv_per_layer_mla_pf_lf(b.host_pf, b.dev[0], idx, idx, 0, 24, 36)
    with pytest.raises(ValueError, match="dst_layout_dim"):
        kvcacheio.transfer_kv_all_layer_mla_lf_pf(ptrs(b.dev), b.host_pf, idx, idx, 24, 60, LAYERS)


def test_cheap_checks() -> None:
    b = make(1, torch.float16)
    idx = torch.arange(3, device=DEVICE)
    with pytest.raises(IndexDTypeError):
        kvcacheio.transfer_kv_per_layer_mla(b.host_lf[0], b.dev[0], idx.int(), idx, b.item)
    with pytest.raises(IndexShapeError):
        kvcacheio.transfer_kv_per_layer_mla(b.host_lf[0], b.dev[0], idx, idx[:2], b.item)
    with pytest.raises(SGLError, match="uint64"):
        kvcacheio.transfer_kv_all_layer_mla(
            ptrs(b.dev).to(torch.int64), ptrs(b.host_lf), idx, idx, b.item, LAYERS
        )
    with pytest.raises(SGLError, match="at least"):
        kvcacheio.transfer_kv_all_layer_mla(ptrs(b.dev[:2]), ptrs(b.host_lf), idx, idx, b.item, 3)
    with pytest.raises(PageAlignmentError):
        kvcacheio.transfer_kv_per_layer_direct_pf_lf(
            [b.host_pfd], [b.dev[0]], idx[:2].cpu(), idx[:2], 0, 4
        )
    with pytest.raises(PageAlignmentError):
        kvcacheio.transfer_kv_direct(b.dev, b.host_lf, idx, idx, 0)


def test_tile_choice() -> None:
    from sgl_cuda._triton import kvcacheio as triton_kvcacheio

    tile_for: Callable[[int], tuple[int, int, bool]] = triton_kvcacheio.tile_for

    assert tile_for(144) == (64, 16, False)  # DeepSeek-V3 bf16 rows
    assert tile_for(3) == (64, 4, True)
    assert tile_for(16) == (64, 16, False)
    block_r, block_w, mask = tile_for(150)
    assert block_w == 64
    assert mask
    assert block_r * block_w <= 1024
