"""Boundary tests of the raw ``kvcacheio`` argument checks (issue #18).

The checks run before a launch, so most cases here never reach a kernel; the
layer-id cases move real bytes (interpreted on CPU) to show which layer moved.
"""

from __future__ import annotations

import pytest
import torch

from sgl_core import errors
from sgl_cuda import _kv_checks, kvcacheio

CPU = torch.device("cpu")
LAYERS, DIM = 3, 8  # bf16 rows of 16 bytes: two int64 words


def i64(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64)


def test_words_takes_positive_multiples_of_eight() -> None:
    assert _kv_checks.words(8, "n") == 1
    assert _kv_checks.words(24, "n") == 3
    for bad in (0, -8, 4, 12, 9, True, 8.0, "8"):
        with pytest.raises(errors.ShapeMismatchError, match="n must be a positive multiple of 8"):
            _kv_checks.words(bad, "n")  # type: ignore[arg-type]


def test_check_indices_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _kv_checks.check_indices(i64(3), i64(3)) == CPU
    assert _kv_checks.check_indices(i64(0), i64(0)) == CPU
    cases: list[tuple[object, object, type[Exception]]] = [
        (i64(3).int(), i64(3), errors.IndexDTypeError),
        (i64(3), i64(3).int(), errors.IndexDTypeError),
        ([0, 1, 2], i64(3), errors.IndexDTypeError),
        (i64(3), None, errors.IndexDTypeError),
        (i64(4).view(2, 2), i64(4), errors.IndexShapeError),
        (i64(4), i64(4).view(2, 2), errors.IndexShapeError),
        (i64(6)[::2], i64(3), errors.IndexShapeError),  # not contiguous
        (i64(3), i64(6)[::2], errors.IndexShapeError),
        (i64(3), i64(2), errors.IndexShapeError),
        (i64(3), i64(3).to("meta"), errors.ShapeMismatchError),
        (i64(3).to("meta"), i64(3).to("meta"), errors.BackendUnavailableError),
    ]
    for src, dst, error in cases:
        with pytest.raises(error):
            _kv_checks.check_indices(src, dst)  # type: ignore[arg-type]
    # the checks live in _kv_checks
    monkeypatch.setattr(_kv_checks, "interpreter_active", lambda: False)
    with pytest.raises(errors.BackendUnavailableError, match="TRITON_INTERPRET=1"):
        _kv_checks.check_indices(i64(3), i64(3))


def test_check_table_edges() -> None:
    table = torch.zeros(LAYERS, dtype=torch.uint64)
    _kv_checks.check_table(table, "t", CPU, LAYERS)
    _kv_checks.check_table(table, "t", CPU, LAYERS - 1)
    _kv_checks.check_table(table[:0], "t", CPU, 0)
    for bad, layers in (
        (table.view(torch.int64), LAYERS),
        (table.tolist(), LAYERS),
        (table.to("meta"), LAYERS),
        (table.view(1, LAYERS), LAYERS),
        (torch.zeros(2 * LAYERS, dtype=torch.uint64)[::2], LAYERS),
        (table[:-1], LAYERS),  # one entry short
        (table, LAYERS + 1),
    ):
        with pytest.raises(errors.ShapeMismatchError, match="t "):
            _kv_checks.check_table(bad, "t", CPU, layers)  # type: ignore[arg-type]


def test_check_buffer_edges() -> None:
    raw = torch.zeros(64, dtype=torch.uint8)
    _kv_checks.check_buffer(raw, "b", CPU)
    _kv_checks.check_buffer(raw[8:], "b", CPU)
    for offset in (1, 4, 7):
        with pytest.raises(errors.ShapeMismatchError, match="b must start on an 8-byte boundary"):
            _kv_checks.check_buffer(raw[offset:], "b", CPU)
    with pytest.raises(errors.ShapeMismatchError, match=r"b must be a torch\.Tensor"):
        _kv_checks.check_buffer(raw.tolist(), "b", CPU)  # type: ignore[arg-type]
    with pytest.raises(errors.ShapeMismatchError, match="b is on meta"):
        _kv_checks.check_buffer(raw.to("meta"), "b", CPU)
    # a CUDA kernel reaches CPU memory only when it is pinned
    with pytest.raises(errors.ShapeMismatchError, match="not pinned host memory"):
        _kv_checks.check_buffer(raw, "b", torch.device("cuda"))
    with pytest.raises(errors.ShapeMismatchError, match="b is on cpu"):
        _kv_checks.check_buffer(raw, "b", torch.device("meta"))


def test_check_layers_and_page_size_edges() -> None:
    assert _kv_checks.check_layer_id(0, "num_layers") == 0
    assert _kv_checks.check_layer_id(LAYERS, "num_layers") == LAYERS
    for bad in (-1, True, 1.0, None):
        with pytest.raises(errors.LayerIndexError, match="num_layers must be a non-negative"):
            _kv_checks.check_layer_id(bad, "num_layers")  # type: ignore[arg-type]
    assert _kv_checks.check_page_size(1) == 1
    assert _kv_checks.check_page_size(64, errors.PageAlignmentError) == 64
    for bad in (0, -1, True, 2.0, None):
        with pytest.raises(errors.PageAlignmentError, match="page_size must be a positive int"):
            _kv_checks.check_page_size(bad, errors.PageAlignmentError)  # type: ignore[arg-type]
        with pytest.raises(errors.ShapeMismatchError, match="page_size must be a positive int"):
            _kv_checks.check_page_size(bad)  # type: ignore[arg-type]


def page_first() -> tuple[torch.Tensor, torch.Tensor]:
    """A page-first host buffer (slots, layers, 1, dim) with distinct rows, and a zero layer."""
    host = torch.arange(8 * LAYERS * DIM, dtype=torch.int16).view(torch.bfloat16)
    return host.view(8, LAYERS, 1, DIM), torch.zeros(6, 1, DIM, dtype=torch.bfloat16)


@pytest.mark.parametrize("layer", [0, LAYERS - 1])
def test_per_layer_pf_lf_moves_only_the_named_layer(layer: int) -> None:
    host, dev = page_first()
    item = DIM * 2
    src, dst = torch.tensor([5, 0, 7]), torch.tensor([1, 4, 2])
    kvcacheio.transfer_kv_per_layer_mla_pf_lf(host, dev, src, dst, layer, item, item * LAYERS)
    expect = torch.zeros_like(dev)
    expect[dst] = host[src, layer]
    assert torch.equal(dev.view(torch.int16), expect.view(torch.int16))


@pytest.mark.parametrize("layer_id", [-1, -LAYERS, True, 1.0, None])
def test_per_layer_pf_lf_rejects_bad_layer_ids_before_a_byte_moves(layer_id: object) -> None:
    host, dev = page_first()
    item = DIM * 2
    src, dst = torch.tensor([5, 0]), torch.tensor([1, 4])
    with pytest.raises(errors.LayerIndexError, match="layer_id must be a non-negative int"):
        kvcacheio.transfer_kv_per_layer_mla_pf_lf(
            host,
            dev,
            src,
            dst,
            layer_id,  # type: ignore[arg-type]
            item,
            item * LAYERS,
        )
    assert not dev.view(torch.int16).any()


def test_per_layer_pf_lf_checks_every_argument() -> None:
    host, dev = page_first()
    item = DIM * 2
    src, dst = torch.tensor([5, 0]), torch.tensor([1, 4])
    bad_calls = [
        (host, dev, src, dst, 0, item + 4, item * LAYERS, "^item_size must"),
        (host, dev, src, dst, 0, item, item * LAYERS + 4, "^src_layout_dim must"),
        (host, dev, src.int(), dst, 0, item, item * LAYERS, "^src_indices must"),
        (host, dev, src, dst[:1], 0, item, item * LAYERS, "equal length"),
        (host.view(-1)[1:], dev, src, dst, 0, item, item * LAYERS, "^src must start"),
        (host, dev.view(-1)[1:], src, dst, 0, item, item * LAYERS, "^dst must start"),
    ]
    for *args, match in bad_calls:
        with pytest.raises(errors.SGLError, match=match):
            kvcacheio.transfer_kv_per_layer_mla_pf_lf(*args)  # type: ignore[arg-type]
    assert not dev.view(torch.int16).any()


class ClaimsPinned(torch.Tensor):
    """CPU memory that reports itself pinned (no GPU here to pin it for real)."""

    def is_pinned(self, device: object = None) -> bool:
        return True


class ClaimsCuda(torch.Tensor):
    """Indices that report a CUDA device (no GPU here)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def test_pinned_host_memory_is_reachable_from_cuda_only() -> None:
    pinned = torch.zeros(64, dtype=torch.uint8).as_subclass(ClaimsPinned)
    _kv_checks.check_buffer(pinned, "b", torch.device("cuda", 0))
    with pytest.raises(errors.ShapeMismatchError, match="b is on cpu"):
        _kv_checks.check_buffer(pinned, "b", torch.device("meta"))
    with pytest.raises(errors.ShapeMismatchError, match="b must start on an 8-byte boundary"):
        _kv_checks.check_buffer(pinned[3:], "b", torch.device("cuda", 0))


def test_cuda_indices_need_no_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    # the checks live in _kv_checks
    monkeypatch.setattr(_kv_checks, "interpreter_active", lambda: False)
    src, dst = i64(3).as_subclass(ClaimsCuda), i64(3).as_subclass(ClaimsCuda)
    assert _kv_checks.check_indices(src, dst) == torch.device("cuda", 0)


def test_index_errors_name_the_argument() -> None:
    for src, dst, name in (
        (i64(3).int(), i64(3), "src_indices"),
        (i64(3), i64(3).int(), "dst_indices"),
        (i64(6)[::2], i64(3), "src_indices"),
        (i64(3), i64(4).view(2, 2), "dst_indices"),
    ):
        with pytest.raises(errors.SGLError, match=rf"^{name} must be"):
            _kv_checks.check_indices(src, dst)


# ------------------------------------------------------------ side_words
def test_side_words_of_each_row_form() -> None:
    """A side's geometry in int64 words, computed by hand for each form."""
    form = _kv_checks.RowForm
    side_words = _kv_checks.side_words
    assert side_words(form("layer_first", "src"), 3, 24) == ((3, 0, 0, 0, 1, False), 3)
    assert side_words(form("table", "dst", layout_dim=999), 5, 40) == ((5, 0, 0, 0, 1, False), 5)
    assert side_words(form("page_first", "src", layout_dim=96), 2, 16) == (
        (12, 2, 0, 0, 1, False),
        2,
    )
    # page_head: 2 heads of a 96-byte token row, page of 4 tokens, 32-byte items
    got = side_words(form("page_head", "dst", layout_dim=96, page_size=4, head_num=2), 4, 32)
    assert got == ((6, 2, 48, 24, 4, True), 2)
    one = side_words(form("page_head", "src", layout_dim=8, page_size=1, head_num=1), 1, 8)
    assert one == ((1, 1, 1, 1, 1, True), 1)


@pytest.mark.parametrize(
    ("kwargs", "item_size", "match"),
    [
        ({"kind": "page_first", "side": "src", "layout_dim": 12}, 16, "src_layout_dim"),
        ({"kind": "page_first", "side": "dst", "layout_dim": 0}, 16, "dst_layout_dim"),
        ({"kind": "page_head", "side": "dst", "layout_dim": 4}, 16, "dst_layout_dim"),
        (
            {"kind": "page_head", "side": "src", "layout_dim": 96, "page_size": 0},
            16,
            "page_size",
        ),
        (
            {"kind": "page_head", "side": "src", "layout_dim": 96, "page_size": 4, "head_num": 0},
            16,
            "head_num",
        ),
        # 96 bytes split into 4 heads: 24 each, a multiple of 8; 16-byte items into 4: 4 each
        (
            {"kind": "page_head", "side": "dst", "layout_dim": 96, "page_size": 4, "head_num": 4},
            16,
            "item_size",
        ),
        (
            {"kind": "page_head", "side": "src", "layout_dim": 40, "page_size": 4, "head_num": 2},
            16,
            "src_layout_dim",
        ),
    ],
)
def test_side_words_refuses_rows_that_do_not_split_into_words(
    kwargs: dict[str, object], item_size: int, match: str
) -> None:
    with pytest.raises(errors.ShapeMismatchError, match=match):
        _kv_checks.side_words(_kv_checks.RowForm(**kwargs), item_size // 8, item_size)  # type: ignore[arg-type]
