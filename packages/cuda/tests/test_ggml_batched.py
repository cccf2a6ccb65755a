"""The expert-grouped ``ggml_moe_a8`` and the method's vec/batched switch, against
the gguf numpy oracle (tolerances as in test_ggml_kernel.py / test_ggml_method.py).

Runs under ``TRITON_INTERPRET=1`` on CPU (conftest) or on a CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _ggml_oracle import ALL_TYPES, BLOCK_SIZE, float_reference, random_blocks, routing
from test_ggml_kernel import _case, _check
from test_ggml_method import make_bank

import sgl_cuda.quantization._method as method_mod
from sgl_core.errors import (
    ArgumentTypeError,
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    QuantTypeError,
    ShapeMismatchError,
)
from sgl_cuda.quantization import (
    GGMLMoEMethod,
    GGMLQuantType,
    ggml_moe_a8,
    ggml_moe_a8_vec,
    ggml_moe_get_block_size,
    moe_align_block_size,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
Q = GGMLQuantType


def _batched(
    x: torch.Tensor,
    w: np.ndarray,
    ids: torch.Tensor,
    qtype: int,
    tile: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    tokens, top_k = ids.shape
    e, row = w.shape[:2]
    block_m = ggml_moe_get_block_size(qtype, tile)
    s, ex, n = moe_align_block_size(ids.to(DEVICE), block_m, e)
    wt = torch.from_numpy(w).to(DEVICE)
    return ggml_moe_a8(x.to(DEVICE), wt, s, ex, n, qtype, row, top_k, tokens, tile=tile)


@pytest.mark.parametrize("qtype", sorted(ALL_TYPES), ids=lambda t: ALL_TYPES[t])
def test_matches_oracle_every_type(qtype: int) -> None:
    # row=24: a partial row tile; 3 experts, one of them possibly idle
    k = 2 * BLOCK_SIZE[qtype] if BLOCK_SIZE[qtype] == 256 else 96
    w, x, ids = _case(qtype, 3, 24, k, 4, 2, seed=1)
    y = _batched(x, w, ids, qtype)
    assert y.shape == (8, 24) and y.dtype == torch.float32
    _check(y, x, w, ids, qtype)


def test_empty_outputs_launch_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pairs or no output rows: both ops return the empty output before any launch;
    K = 0: zeros, unlaunched too (the launchers and the quantizer count on it)."""
    from sgl_cuda._triton import ggml

    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("an empty output reached a launcher")

    monkeypatch.setattr(ggml, "moe_a8_vec", no_launch)
    monkeypatch.setattr(ggml, "moe_a8_mmq", no_launch)
    w, x, ids = _case(2, 2, 4, 32, 2, 1, seed=0)
    wt = torch.from_numpy(w).to(DEVICE)
    none = torch.zeros((0, 1), dtype=torch.int32)
    assert ggml_moe_a8_vec(x[:0].to(DEVICE), wt, none.to(DEVICE), 1, 2, 4, 0).shape == (0, 4)
    assert ggml_moe_a8_vec(x.to(DEVICE), wt[:, :0], ids.to(DEVICE), 1, 2, 0, 2).shape == (2, 0)
    assert _batched(x[:0], w, none, 2).shape == (0, 4)
    assert _batched(x, w[:, :0], ids, 2).shape == (2, 0)
    zeros = torch.zeros(2, 4, device=DEVICE)
    x0, w0 = x[:, :0], w[:, :, :0]
    assert torch.equal(
        ggml_moe_a8_vec(x0.to(DEVICE), wt[:, :, :0], ids.to(DEVICE), 1, 2, 4, 2), zeros
    )
    assert torch.equal(_batched(x0, w0, ids, 2), zeros)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.Q6_K])
@pytest.mark.parametrize("top_k", [1, 8])
def test_uneven_loads_idle_experts(qtype: GGMLQuantType, top_k: int) -> None:
    # 12 experts: expert 5 in every token's list, experts 0, 1 and 11 in none
    tokens, e, row = 19, 12, 16
    k = BLOCK_SIZE[int(qtype)]
    w, x, _ = _case(int(qtype), e, row, k, tokens, top_k, seed=top_k)
    pool = [2, 3, 4, 6, 7, 8, 9, 10]
    ids = torch.tensor(
        [[5, *pool[t % 8 :], *pool[: t % 8]][:top_k] for t in range(tokens)], dtype=torch.int32
    )
    y = _batched(x, w, ids, int(qtype))
    _check(y, x, w, ids, int(qtype))


@pytest.mark.parametrize("tile", [(16, 16, 64, 4), (32, 64, 32, 4), (16, 16, 512, 4)])
def test_tile_override(tile: tuple[int, int, int, int]) -> None:
    # BLOCK_K 64: two Q8_1 blocks per K step; BLOCK_N 16: three row tiles; BLOCK_M 32;
    # BLOCK_K 512: one K step spans two Q4_K blocks (the 64-wide nibble path must not apply)
    qtype = int(Q.Q4_K)
    w, x, ids = _case(qtype, 3, 40, 512, 5, 3, seed=7)
    _check(_batched(x, w, ids, qtype, tile), x, w, ids, qtype)


def test_half_precision_input() -> None:
    w, x, ids = _case(int(Q.Q8_0), 2, 16, 64, 3, 2, seed=2)
    xh = x.to(torch.bfloat16)
    y = _batched(xh, w, ids, int(Q.Q8_0))
    assert y.dtype == torch.bfloat16
    _check(y, xh.float(), w, ids, int(Q.Q8_0))


def _args() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    w, x, ids = _case(2, 2, 4, 32, 2, 1)
    s, ex, n = moe_align_block_size(ids, ggml_moe_get_block_size(2), 2)
    return x, torch.from_numpy(w), s, ex, n


def test_argument_errors_change_nothing() -> None:
    x, w, s, ex, n = _args()
    before = [t.clone() for t in (x, w, s, ex, n)]
    with pytest.raises(IndexDTypeError, match="sorted_token_ids"):
        ggml_moe_a8(x, w, s.long(), ex, n, 2, 4, 1, 2)
    with pytest.raises(IndexShapeError, match="block_m"):
        ggml_moe_a8(x, w, s[:-1], ex, n, 2, 4, 1, 2)
    with pytest.raises(IndexShapeError, match="one value"):
        ggml_moe_a8(x, w, s, ex, n.repeat(2), 2, 4, 1, 2)
    bad_s = s.clone()
    bad_s[0] = -1
    with pytest.raises(IndexOutOfRangeError):
        ggml_moe_a8(x, w, bad_s, ex, n, 2, 4, 1, 2)
    bad_e = ex.clone()
    bad_e[0] = 2
    with pytest.raises(IndexOutOfRangeError):
        ggml_moe_a8(x, w, s, bad_e, n, 2, 4, 1, 2)
    with pytest.raises(ShapeMismatchError, match="row=5"):
        ggml_moe_a8(x, w, s, ex, n, 2, 5, 1, 2)
    with pytest.raises(QuantTypeError, match="IQ2_XXS"):
        ggml_moe_a8(x, w, s, ex, n, 16, 4, 1, 2)
    for a, b in zip(before, (x, w, s, ex, n), strict=True):
        assert torch.equal(a, b)


def test_known_unsupported_types_are_named() -> None:
    x, w, *_ = _args()
    ids = torch.zeros((2, 1), dtype=torch.int32)
    for bad, name in ((1, "F16"), (19, "IQ1_S"), (39, "MXFP4")):
        with pytest.raises(QuantTypeError, match=rf"={bad} is GGML type {name}.*IQ4_XS=23"):
            ggml_moe_a8_vec(x, w, ids, 1, bad, 4, 2)


# --- GGMLMoEMethod: the vec/batched switch ----------------------------------------


def _spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"vec": 0, "batched": 0}
    vec, batched = method_mod.ggml_moe_a8_vec, method_mod.ggml_moe_a8

    def count_vec(*a: object, **kw: object) -> torch.Tensor:
        calls["vec"] += 1
        return vec(*a, **kw)  # type: ignore[arg-type]

    def count_batched(*a: object, **kw: object) -> torch.Tensor:
        calls["batched"] += 1
        return batched(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(method_mod, "ggml_moe_a8_vec", count_vec)
    monkeypatch.setattr(method_mod, "ggml_moe_a8", count_batched)
    return calls


@pytest.mark.parametrize(("gu_type", "down_type"), [(Q.Q4_K, Q.Q8_0), (Q.Q8_0, Q.Q4_K)])
def test_method_above_threshold_is_batched_and_matches(
    gu_type: GGMLQuantType, down_type: GGMLQuantType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 65 tokens: just above the default threshold of 64; top_k 2 of 5 experts
    hidden, inter, e, tokens, top_k = 256, BLOCK_SIZE[int(down_type)], 5, 65, 2
    bank, wgu, wd = make_bank(gu_type, down_type, e, hidden, inter, seed=3)
    weights, ids = routing(tokens, top_k, e, seed=3)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(4))
    calls = _spy(monkeypatch)
    args = (bank.to(DEVICE), x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE))
    y = GGMLMoEMethod().apply(*args).cpu()
    assert calls == {"vec": 0, "batched": 2}
    emulated = float_reference(
        x.numpy(), wgu, wd, weights.double().numpy(), ids.numpy(), emulate=True
    )
    rel = np.linalg.norm(y.double().numpy() - emulated) / np.linalg.norm(emulated)
    assert rel < 2e-4
    y_vec = GGMLMoEMethod(batched_threshold=tokens).apply(*args).cpu()
    assert calls == {"vec": 2, "batched": 2}
    # same Q8_1 numerics; float32 sums in another order can flip the odd intermediate
    # activation's rounding, hence a norm bound as against the emulation
    diff = float((y.double() - y_vec.double()).norm() / y_vec.double().norm())
    assert diff < 2e-4


def test_method_threshold_is_inclusive_for_vec(monkeypatch: pytest.MonkeyPatch) -> None:
    bank, _, _ = make_bank(Q.Q4_0, Q.Q4_0, 3, 64, 32)
    weights, ids = routing(3, 2, 3)
    x = torch.randn(3, 64)
    calls = _spy(monkeypatch)
    args = (bank.to(DEVICE), x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE))
    GGMLMoEMethod(batched_threshold=3).apply(*args)
    assert calls == {"vec": 2, "batched": 0}
    GGMLMoEMethod(batched_threshold=2).apply(*args)
    assert calls == {"vec": 2, "batched": 2}
    assert GGMLMoEMethod().batched_threshold == 64


@pytest.mark.parametrize("threshold", [0, 64])
def test_method_rejects_out_of_range_ids_on_both_paths(threshold: int) -> None:
    # both paths launch with check_ids=False: check_routing's range check is the one
    bank, _, _ = make_bank(Q.Q4_0, Q.Q4_0, 3, 64, 32)
    weights, ids = routing(3, 2, 3)
    ids[1, 0] = 3
    with pytest.raises(IndexOutOfRangeError, match=r"\[0, 3\)"):
        GGMLMoEMethod(batched_threshold=threshold).apply(bank, torch.randn(3, 64), weights, ids)


def test_method_threshold_validation() -> None:
    with pytest.raises(ArgumentTypeError):
        GGMLMoEMethod(batched_threshold=1.5)  # type: ignore[arg-type]
    with pytest.raises(ShapeMismatchError):
        GGMLMoEMethod(batched_threshold=-1)
    # a bad tile fails at construction, not at the first call above the threshold
    with pytest.raises(ShapeMismatchError):
        GGMLMoEMethod(tile=(16, 128, 48, 4))
    with pytest.raises(ArgumentTypeError):
        GGMLMoEMethod(tile=[16, 128, 32, 4])  # type: ignore[arg-type]


def test_iq4_random_blocks_cover_every_index() -> None:
    # the IQ4 tests above only mean something if every table entry occurs
    rng = np.random.default_rng(0)
    for qtype, skip in ((20, 2), (23, 8)):
        w = random_blocks(qtype, 8, BLOCK_SIZE[qtype], rng)
        nib = w[:, skip:]
        assert set(np.unique(nib & 15)) == set(range(16))


def test_method_realigns_when_the_types_tiles_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    # down's default tile pads pairs to 32, gate_up's to 16: down must get its own alignment
    from sgl_cuda._triton import ggml

    tiles = {int(Q.Q4_K): (16, 64, 32, 1), int(Q.Q8_0): (32, 64, 32, 1)}
    monkeypatch.setattr(ggml, "default_tile", lambda q: tiles[q])
    hidden, inter, e, tokens, top_k = 256, 32, 4, 5, 2
    bank, wgu, wd = make_bank(Q.Q4_K, Q.Q8_0, e, hidden, inter, seed=6)
    weights, ids = routing(tokens, top_k, e, seed=6)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(6))
    y = GGMLMoEMethod(batched_threshold=0).apply(
        bank.to(DEVICE), x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)
    )
    emulated = float_reference(
        x.numpy(), wgu, wd, weights.double().numpy(), ids.numpy(), emulate=True
    )
    rel = np.linalg.norm(y.cpu().double().numpy() - emulated) / np.linalg.norm(emulated)
    assert rel < 2e-4


def test_odd_address_weights_are_rejected() -> None:
    x, w, s, ex, n = _args()
    buf = torch.zeros(w.numel() + 1, dtype=torch.uint8)
    odd = buf[1:].view(w.shape)
    odd.copy_(w)
    ids = torch.zeros((2, 1), dtype=torch.int32)
    with pytest.raises(ShapeMismatchError, match="even address"):
        ggml_moe_a8_vec(x, odd, ids, 1, 2, 4, 2)
    with pytest.raises(ShapeMismatchError, match="even address"):
        ggml_moe_a8(x, odd, s, ex, n, 2, 4, 1, 2)
    assert ggml_moe_a8_vec(x.to(DEVICE), odd.clone().to(DEVICE), ids.to(DEVICE), 1, 2, 4, 2).shape


@pytest.mark.parametrize(
    ("tile", "error"),
    [
        ((16, 128, 32), ArgumentTypeError),
        ((16, 128, 32, 0), ArgumentTypeError),
        ((16, 128, 48, 4), ShapeMismatchError),
        ((16, 96, 32, 4), ShapeMismatchError),
        ((16, 128, 16, 4), ShapeMismatchError),
    ],
)
def test_bad_tiles_are_rejected(tile: tuple[int, ...], error: type[Exception]) -> None:
    x, w, s, ex, n = _args()
    with pytest.raises(error, match="tile"):
        ggml_moe_a8(x, w, s, ex, n, 2, 4, 1, 2, tile=tile)  # type: ignore[arg-type]
    with pytest.raises(error, match="tile"):
        ggml_moe_get_block_size(2, tile)  # type: ignore[arg-type]


def test_q8_1_sums_are_d_times_sum_q() -> None:
    import os

    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter")
    from _ggml_oracle import q8_1_roundtrip

    from sgl_cuda._triton.ggml import quantize_q8_1_with_sums

    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 96)).astype(np.float32) * 3
    x[1, 32:64] = 0.0  # d = 0: s = 0
    q, d, s = quantize_q8_1_with_sums(torch.from_numpy(x).to(DEVICE))
    q_ref, d_ref, _ = q8_1_roundtrip(x)
    np.testing.assert_array_equal(q.cpu().numpy().astype(np.int64), q_ref)
    np.testing.assert_array_equal(d.cpu().numpy(), d_ref)
    sums = q_ref.reshape(3, 3, 32).sum(-1).astype(np.float32)
    np.testing.assert_array_equal(s.cpu().numpy(), d_ref * sums)  # one float32 rounding
