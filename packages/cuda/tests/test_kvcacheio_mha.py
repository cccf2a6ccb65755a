"""The MHA (K and V) ``sgl_cuda.kvcacheio`` kernels against torch references.

Without a GPU these run on CPU tensors under ``TRITON_INTERPRET=1`` (see
conftest.py). The references index the host layouts as torch tensors
(``host[c, idx // ps, head, idx % ps, layer]`` and so on), independent of the
kernels' byte arithmetic, and every comparison is on raw bytes of whole
buffers, so a stray write anywhere fails. Each device layer of K and of V is
its own allocation.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch

from sgl_core.errors import IndexDTypeError, IndexShapeError, LayerIndexError, SGLError
from sgl_cuda import kvcacheio

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bits(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns (NaNs included) of any 1- or 2-byte dtype: compare as bytes."""
    raw_ = torch.randint(0, 256, (*shape, torch.empty((), dtype=dtype).element_size()),
                         dtype=torch.int64, generator=gen)  # fmt: skip
    return raw_.to(torch.uint8).view(dtype).reshape(shape)


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8)


def ptrs(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64, device=DEVICE)


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


@dataclass
class KV:
    """Device per-layer K/V rows and the three host layouts, all random."""

    dev: list[list[torch.Tensor]]  # [K, V] x layers x (dev_slots, H, D), separate allocations
    lf: torch.Tensor  # (2, L, host_slots, H, D)
    pf: torch.Tensor  # (2, host_slots, L, H, D)
    ph: torch.Tensor  # (2, host_pages, H, ps, L, D)
    layers: int
    heads: int
    ps: int

    @property
    def item(self) -> int:
        return self.dev[0][0][0].numel() * self.dev[0][0].element_size()


DEV_PAGES, HOST_PAGES = 5, 6


def make(dtype: torch.dtype, *, layers: int, heads: int, dim: int, ps: int, seed: int) -> KV:
    gen = torch.Generator().manual_seed(seed)
    dev = [
        [bits((DEV_PAGES * ps, heads, dim), dtype, gen).to(DEVICE) for _ in range(layers)]
        for _ in range(2)
    ]
    n = HOST_PAGES * ps

    def host(shape: tuple[int, ...]) -> torch.Tensor:
        t = bits(shape, dtype, gen)
        return t.pin_memory() if DEVICE.type == "cuda" else t

    lf = host((2, layers, n, heads, dim))
    pf = host((2, n, layers, heads, dim))
    ph = host((2, HOST_PAGES, heads, ps, layers, dim))
    return KV(dev, lf, pf, ph, layers, heads, ps)


def pairing(n_src: int, n_dst: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random injective pairing of single token slots (no page structure)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randperm(n_src, generator=gen)[:count]
    dst = torch.randperm(n_dst, generator=gen)[:count]
    return src, dst


def ph_rows(ph: torch.Tensor, c: int, idx: torch.Tensor, layer: int, ps: int) -> torch.Tensor:
    """Rows ``idx`` of one layer of a page-head host buffer as (n, H, D)."""
    return ph[c, idx // ps, :, idx % ps, layer]


CASES = [
    # dtype, layers, heads, dim, page_size
    (torch.bfloat16, 3, 1, 8, 1),
    (torch.float16, 2, 4, 4, 4),  # GQA-like: several KV heads, 8-byte heads
    (torch.bfloat16, 3, 2, 12, 2),  # 24-byte heads: rows of 6 words (masked tiles)
    (torch.float8_e4m3fn, 2, 3, 8, 4),  # fp8 moved as bytes; 3 heads
]
cases = pytest.mark.parametrize(("dtype", "layers", "heads", "dim", "ps"), CASES)


# ------------------------------------------------------------------- loads
@cases
def test_per_layer(dtype: torch.dtype, layers: int, heads: int, dim: int, ps: int) -> None:
    b = make(dtype, layers=layers, heads=heads, dim=dim, ps=ps, seed=1)
    h, d = pairing(HOST_PAGES * ps, DEV_PAGES * ps, 2 * ps + 1, seed=2)
    layer = layers - 1
    before = [[t.cpu().clone() for t in comp] for comp in b.dev]
    kvcacheio.transfer_kv_per_layer(
        b.lf[0, layer], b.dev[0][layer], b.lf[1, layer], b.dev[1][layer],
        h.to(DEVICE), d.to(DEVICE), b.item,
    )  # fmt: skip
    sync()
    for c in range(2):
        for lay in range(layers):
            expected = before[c][lay].clone()
            if lay == layer:
                expected[d] = b.lf[c, layer][h]
            assert torch.equal(raw(b.dev[c][lay]), raw(expected))


@cases
def test_per_layer_pf_lf(dtype: torch.dtype, layers: int, heads: int, dim: int, ps: int) -> None:
    b = make(dtype, layers=layers, heads=heads, dim=dim, ps=ps, seed=3)
    h, d = pairing(HOST_PAGES * ps, DEV_PAGES * ps, 2 * ps + 1, seed=4)
    for layer in reversed(range(layers)):
        before = [b.dev[c][layer].cpu().clone() for c in range(2)]
        kvcacheio.transfer_kv_per_layer_pf_lf(
            b.pf[0], b.dev[0][layer], b.pf[1], b.dev[1][layer], h.to(DEVICE), d.to(DEVICE),
            layer, b.item, b.item * layers,
        )  # fmt: skip
        sync()
        for c in range(2):
            expected = before[c]
            expected[d] = b.pf[c][h, layer]
            assert torch.equal(raw(b.dev[c][layer]), raw(expected))


@cases
def test_per_layer_ph_lf(dtype: torch.dtype, layers: int, heads: int, dim: int, ps: int) -> None:
    b = make(dtype, layers=layers, heads=heads, dim=dim, ps=ps, seed=5)
    h, d = pairing(HOST_PAGES * ps, DEV_PAGES * ps, 2 * ps + 1, seed=6)
    untouched = [[t.cpu().clone() for t in comp] for comp in b.dev]
    for layer in (layers - 1, 0):
        before = [b.dev[c][layer].cpu().clone() for c in range(2)]
        kvcacheio.transfer_kv_per_layer_ph_lf(
            b.ph[0], b.dev[0][layer], b.ph[1], b.dev[1][layer], h.to(DEVICE), d.to(DEVICE),
            layer, b.item, b.item * layers, ps, heads,
        )  # fmt: skip
        sync()
        for c in range(2):
            expected = before[c]
            expected[d] = ph_rows(b.ph, c, h, layer, ps)
            assert torch.equal(raw(b.dev[c][layer]), raw(expected))
    for c in range(2):
        for lay in range(1, layers - 1):
            assert torch.equal(raw(b.dev[c][lay]), raw(untouched[c][lay]))


# ----------------------------------------------------------------- backups
@cases
def test_all_layer(dtype: torch.dtype, layers: int, heads: int, dim: int, ps: int) -> None:
    b = make(dtype, layers=layers, heads=heads, dim=dim, ps=ps, seed=7)
    d, h = pairing(DEV_PAGES * ps, HOST_PAGES * ps, 2 * ps + 1, seed=8)
    expected = b.lf.clone()
    kvcacheio.transfer_kv_all_layer(
        ptrs(b.dev[0]), ptrs([b.lf[0, lay] for lay in range(layers)]),
        ptrs(b.dev[1]), ptrs([b.lf[1, lay] for lay in range(layers)]),
        d.to(DEVICE), h.to(DEVICE), b.item, layers,
    )  # fmt: skip
    sync()
    for c in range(2):
        for lay in range(layers):
            expected[c, lay][h] = b.dev[c][lay].cpu()[d]
    assert torch.equal(raw(b.lf), raw(expected))


@cases
def test_all_layer_lf_pf(dtype: torch.dtype, layers: int, heads: int, dim: int, ps: int) -> None:
    b = make(dtype, layers=layers, heads=heads, dim=dim, ps=ps, seed=9)
    d, h = pairing(DEV_PAGES * ps, HOST_PAGES * ps, 2 * ps + 1, seed=10)
    expected = b.pf.clone()
    kvcacheio.transfer_kv_all_layer_lf_pf(
        ptrs(b.dev[0]), b.pf[0], ptrs(b.dev[1]), b.pf[1], d.to(DEVICE), h.to(DEVICE),
        b.item, b.item * layers, layers,
    )  # fmt: skip
    sync()
    for c in range(2):
        for lay in range(layers):
            expected[c][h, lay] = b.dev[c][lay].cpu()[d]
    assert torch.equal(raw(b.pf), raw(expected))


@cases
def test_all_layer_lf_ph(dtype: torch.dtype, layers: int, heads: int, dim: int, ps: int) -> None:
    b = make(dtype, layers=layers, heads=heads, dim=dim, ps=ps, seed=11)
    d, h = pairing(DEV_PAGES * ps, HOST_PAGES * ps, 2 * ps + 1, seed=12)
    expected = b.ph.clone()
    kvcacheio.transfer_kv_all_layer_lf_ph(
        ptrs(b.dev[0]), b.ph[0], ptrs(b.dev[1]), b.ph[1], d.to(DEVICE), h.to(DEVICE),
        b.item, b.item * layers, layers, ps, heads,
    )  # fmt: skip
    sync()
    for c in range(2):
        for lay in range(layers):
            rows = b.dev[c][lay].cpu()[d]  # (n, H, D)
            for i in range(len(h)):
                slot = int(h[i])
                for head in range(heads):
                    expected[c, slot // ps, head, slot % ps, lay] = rows[i, head]
    assert torch.equal(raw(b.ph), raw(expected))


def test_page_head_round_trip_whole_pages() -> None:
    """Backup of whole pages into page_head, then a load into fresh device rows."""
    b = make(torch.bfloat16, layers=2, heads=4, dim=4, ps=4, seed=13)
    d = torch.tensor([8, 9, 10, 11, 0, 1, 2, 3])  # device pages 2, 0
    h = torch.tensor([20, 21, 22, 23, 4, 5, 6, 7])  # host pages 5, 1
    kvcacheio.transfer_kv_all_layer_lf_ph(
        ptrs(b.dev[0]), b.ph[0], ptrs(b.dev[1]), b.ph[1], d.to(DEVICE), h.to(DEVICE),
        b.item, b.item * 2, 2, 4, 4,
    )  # fmt: skip
    fresh = [torch.zeros_like(b.dev[c][1]) for c in range(2)]
    kvcacheio.transfer_kv_per_layer_ph_lf(
        b.ph[0], fresh[0], b.ph[1], fresh[1], h.to(DEVICE), d.to(DEVICE), 1, b.item,
        b.item * 2, 4, 4,
    )  # fmt: skip
    sync()
    for c in range(2):
        assert torch.equal(raw(fresh[c][d]), raw(b.dev[c][1][d]))
        rest = torch.ones(fresh[c].shape[0], dtype=torch.bool)
        rest[d] = False
        assert not raw(fresh[c][rest]).any()


def test_empty_indices_are_a_no_op() -> None:
    b = make(torch.float16, layers=2, heads=2, dim=4, ps=1, seed=14)
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    before = raw(b.ph).clone()
    kvcacheio.transfer_kv_all_layer_lf_ph(
        ptrs(b.dev[0]), b.ph[0], ptrs(b.dev[1]), b.ph[1], empty, empty, b.item, b.item * 2, 2, 1, 2
    )
    assert torch.equal(raw(b.ph), before)


# -------------------------------------------------------------- signatures
UPSTREAM = {
    "transfer_kv_per_layer": "src_k dst_k src_v dst_v src_indices dst_indices item_size",
    "transfer_kv_per_layer_pf_lf": (
        "src_k dst_k src_v dst_v src_indices dst_indices layer_id item_size src_layout_dim"
    ),
    "transfer_kv_per_layer_ph_lf": (
        "src_k dst_k src_v dst_v src_indices dst_indices layer_id item_size src_layout_dim "
        "page_size head_num"
    ),
    "transfer_kv_all_layer": (
        "src_k_layers dst_k_layers src_v_layers dst_v_layers src_indices dst_indices "
        "item_size num_layers"
    ),
    "transfer_kv_all_layer_lf_pf": (
        "src_k_layers dst_k src_v_layers dst_v src_indices dst_indices item_size "
        "dst_layout_dim num_layers"
    ),
    "transfer_kv_all_layer_lf_ph": (
        "src_k_layers dst_k src_v_layers dst_v src_indices dst_indices item_size "
        "dst_layout_dim num_layers page_size head_num"
    ),
}


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_upstream_names_and_argument_order(name: str) -> None:
    assert name in kvcacheio.__all__
    params = list(inspect.signature(getattr(kvcacheio, name)).parameters)
    assert params == UPSTREAM[name].split()


# ------------------------------------------------------------------ errors
def _good_calls(b: KV) -> dict[str, dict[str, object]]:
    """A valid keyword call of each function (2 layers, 2 heads, ps 2) on ``b``."""
    idx = torch.arange(3, device=DEVICE)
    rows = {"src_indices": idx, "dst_indices": idx, "item_size": b.item}
    k_tbl, v_tbl = ptrs(b.dev[0]), ptrs(b.dev[1])
    ph = {"page_size": 2, "head_num": 2}
    return {
        "transfer_kv_per_layer": {
            "src_k": b.lf[0, 0], "dst_k": b.dev[0][0], "src_v": b.lf[1, 0],
            "dst_v": b.dev[1][0], **rows,
        },
        "transfer_kv_per_layer_pf_lf": {
            "src_k": b.pf[0], "dst_k": b.dev[0][1], "src_v": b.pf[1], "dst_v": b.dev[1][1],
            **rows, "layer_id": 1, "src_layout_dim": 2 * b.item,
        },
        "transfer_kv_per_layer_ph_lf": {
            "src_k": b.ph[0], "dst_k": b.dev[0][1], "src_v": b.ph[1], "dst_v": b.dev[1][1],
            **rows, "layer_id": 1, "src_layout_dim": 2 * b.item, **ph,
        },
        "transfer_kv_all_layer": {
            "src_k_layers": k_tbl, "dst_k_layers": ptrs([b.lf[0, 0], b.lf[0, 1]]),
            "src_v_layers": v_tbl, "dst_v_layers": ptrs([b.lf[1, 0], b.lf[1, 1]]),
            **rows, "num_layers": 2,
        },
        "transfer_kv_all_layer_lf_pf": {
            "src_k_layers": k_tbl, "dst_k": b.pf[0], "src_v_layers": v_tbl, "dst_v": b.pf[1],
            **rows, "dst_layout_dim": 2 * b.item, "num_layers": 2,
        },
        "transfer_kv_all_layer_lf_ph": {
            "src_k_layers": k_tbl, "dst_k": b.ph[0], "src_v_layers": v_tbl, "dst_v": b.ph[1],
            **rows, "dst_layout_dim": 2 * b.item, "num_layers": 2, **ph,
        },
    }  # fmt: skip


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)[1:]  # 2 bytes past an 8-byte boundary (fp16)


_IDX = torch.arange(3, device=DEVICE)
_ALL = [
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
]
_PER_LAYER = [n for n in _ALL if "per_layer" in n]
_PH = [n for n in _ALL if n.endswith("ph") or "_ph_" in n]
_LAYOUT = {n: ("src_layout_dim" if "per_layer" in n else "dst_layout_dim") for n in _ALL}
_BUFFERS = {
    "transfer_kv_per_layer": ("src_k", "dst_k", "src_v", "dst_v"),
    "transfer_kv_per_layer_pf_lf": ("src_k", "dst_k", "src_v", "dst_v"),
    "transfer_kv_per_layer_ph_lf": ("src_k", "dst_k", "src_v", "dst_v"),
    "transfer_kv_all_layer_lf_pf": ("dst_k", "dst_v"),
    "transfer_kv_all_layer_lf_ph": ("dst_k", "dst_v"),
}
_TABLES = {
    "transfer_kv_all_layer": ("src_k_layers", "dst_k_layers", "src_v_layers", "dst_v_layers"),
    "transfer_kv_all_layer_lf_pf": ("src_k_layers", "src_v_layers"),
    "transfer_kv_all_layer_lf_ph": ("src_k_layers", "src_v_layers"),
}

# (function, argument, bad value or a function of the good value, error, message)
BAD: list[tuple[str, str, object, type[SGLError], str]] = [
    *[(n, "item_size", 20, SGLError, "multiple of 8") for n in _ALL],
    *[(n, "item_size", 0, SGLError, "item_size") for n in _ALL],
    *[(n, "src_indices", _IDX.int(), IndexDTypeError, "int64") for n in _ALL],
    *[(n, "dst_indices", _IDX[:2], IndexShapeError, "equal length") for n in _ALL],
    *[(n, "src_indices", _IDX.reshape(1, 3), IndexShapeError, "1-D") for n in _ALL],
    *[(n, _LAYOUT[n], 12, SGLError, "multiple of 8") for n in _ALL if "pf" in n or n in _PH],
    *[(n, "layer_id", v, LayerIndexError, "layer_id") for n in _PER_LAYER[1:] for v in (-1, True)],
    *[(n, "num_layers", -1, LayerIndexError, "num_layers") for n in _TABLES],
    *[(n, "page_size", 0, SGLError, "page_size") for n in _PH],
    *[(n, "page_size", 2.0, SGLError, "page_size") for n in _PH],
    *[(n, "head_num", 0, SGLError, "head_num") for n in _PH],
    *[(n, "head_num", True, SGLError, "head_num") for n in _PH],
    # 16-byte rows do not split into 3 heads of whole words ...
    *[(n, "head_num", 3, SGLError, "item_size") for n in _PH],
    # ... nor does a 24-byte layout dim into 2 (the item size does)
    *[(n, _LAYOUT[n], 24, SGLError, _LAYOUT[n]) for n in _PH],
    *[(n, a, _misaligned, SGLError, "8-byte") for n, names in _BUFFERS.items() for a in names],
    *[(n, a, lambda t: t.to("meta"), SGLError, "is on") for n, names in _BUFFERS.items()
      for a in names],
    *[(n, a, lambda t: t.to(torch.int64), SGLError, "uint64") for n, names in _TABLES.items()
      for a in names],
    *[(n, a, lambda t: t[:1], SGLError, "at least") for n, names in _TABLES.items()
      for a in names],
]  # fmt: skip


@pytest.mark.parametrize(("name", "arg", "bad", "error", "match"), BAD)
def test_bad_arguments_change_nothing(
    name: str, arg: str, bad: object, error: type[SGLError], match: str
) -> None:
    b = make(torch.float16, layers=2, heads=2, dim=4, ps=2, seed=15)
    kwargs = _good_calls(b)[name]
    kwargs[arg] = bad(kwargs[arg]) if callable(bad) else bad
    snapshot = [raw(t).clone() for t in (*b.dev[0], *b.dev[1], b.lf, b.pf, b.ph)]
    with pytest.raises(error, match=match):
        getattr(kvcacheio, name)(**kwargs)
    after = [raw(t) for t in (*b.dev[0], *b.dev[1], b.lf, b.pf, b.ph)]
    assert all(torch.equal(x, y) for x, y in zip(snapshot, after, strict=True))


@pytest.mark.parametrize("name", _ALL)
def test_good_calls_of_the_error_tests_run(name: str) -> None:
    """The unmodified calls above are valid, so each rejection is due to its one change."""
    b = make(torch.float16, layers=2, heads=2, dim=4, ps=2, seed=16)
    getattr(kvcacheio, name)(**_good_calls(b)[name])


# ------------------------------------------------- one component, tunables
def test_rows_one_component_of_its_own_width() -> None:
    """V rows narrower than K rows (v_head_dim != head_dim): one K-only launch per width."""
    from sgl_cuda._kv_checks import RowForm
    from sgl_cuda.kvcacheio import _rows

    gen = torch.Generator().manual_seed(17)
    layers, heads, ps = 2, 2, 2
    dev_v = [bits((8, heads, 4), torch.float16, gen) for _ in range(layers)]  # 16-byte rows
    host_v = bits((4, heads, ps, layers, 4), torch.float16, gen)  # page_head, V only
    other = bits((4, heads, ps, layers, 4), torch.float16, gen)
    d, h = torch.tensor([3, 0, 6]), torch.tensor([5, 2, 0])
    expected = host_v.clone()
    _rows(
        (ptrs(dev_v),), (host_v,), (d, h), 16,
        (RowForm("table", "src"), RowForm("page_head", "dst", 16 * layers, ps, heads)),
        num_layers=layers,
    )  # fmt: skip
    for lay in range(layers):
        for i in range(3):
            expected[int(h[i]) // ps, :, int(h[i]) % ps, lay] = dev_v[lay][int(d[i])]
    assert torch.equal(raw(host_v), raw(expected))
    before = raw(other).clone()
    with pytest.raises(SGLError, match="one or two"):
        _rows(
            (ptrs(dev_v),), (host_v, other), (d, h), 16,
            (RowForm("table", "src"), RowForm("page_first", "dst", 32)),
            num_layers=layers,
        )  # fmt: skip
    with pytest.raises(SGLError, match="at most one side"):
        _rows(
            (host_v,), (other,), (h, h), 16,
            (RowForm("page_head", "src", 32, ps, heads),
             RowForm("page_head", "dst", 32, ps, heads)),
        )  # fmt: skip
    assert torch.equal(raw(other), before)


@pytest.mark.parametrize(
    ("block_r", "block_w", "num_warps", "layers_inner"),
    [(8, 4, 1, None), (4, 2, 2, True), (16, 8, 8, False)],
)
def test_launch_tunables(
    block_r: int, block_w: int, num_warps: int, layers_inner: bool | None
) -> None:
    """Any tile (masked, split across heads or not), warp count and grid order: same bytes."""
    from sgl_cuda._triton import kvcacheio as kv_mha

    b = make(torch.bfloat16, layers=2, heads=2, dim=12, ps=2, seed=18)  # heads of 3 words
    d, h = pairing(DEV_PAGES * 2, HOST_PAGES * 2, 5, seed=19)
    w, lw = b.item // 8, b.item * 2 // 8
    expected = b.ph.clone()
    k_tbl, v_tbl = ptrs(b.dev[0]), ptrs(b.dev[1])
    kv_mha.launch_copy_kv_rows(
        k_tbl, b.ph[0], d.to(DEVICE), h.to(DEVICE), words=w, head_words=w // 2,
        layer_offset=0, num_layers=2,
        src_v_delta=(v_tbl.data_ptr() - k_tbl.data_ptr()) // 8,
        dst_v_delta=(b.ph[1].data_ptr() - b.ph[0].data_ptr()) // 8,
        src_side=(w, 0, 0, 0, 1, False), dst_side=(lw // 2, w // 2, 2 * lw, lw, 2, True),
        src_table=True, dst_table=False, block_r=block_r, block_w=block_w,
        num_warps=num_warps, layers_inner=layers_inner,
    )  # fmt: skip
    sync()
    for c in range(2):
        for lay in range(2):
            expected[c, h // 2, :, h % 2, lay] = b.dev[c][lay].cpu()[d]
    assert torch.equal(raw(b.ph), raw(expected))


def test_v_below_k_in_memory() -> None:
    """V's buffer at a lower address than K's (a negative K-to-V distance) moves the same bytes."""
    b = make(torch.float16, layers=2, heads=2, dim=4, ps=2, seed=20)
    h, d = pairing(HOST_PAGES * 2, DEV_PAGES * 2, 5, seed=21)
    assert b.pf[1].data_ptr() > b.pf[0].data_ptr()
    before = [b.dev[c][1].cpu().clone() for c in range(2)]
    kvcacheio.transfer_kv_per_layer_pf_lf(
        b.pf[1], b.dev[1][1], b.pf[0], b.dev[0][1], h.to(DEVICE), d.to(DEVICE), 1, b.item,
        b.item * 2,
    )  # fmt: skip
    sync()
    for c in range(2):
        before[c][d] = b.pf[c][h, 1]
        assert torch.equal(raw(b.dev[c][1]), raw(before[c]))
