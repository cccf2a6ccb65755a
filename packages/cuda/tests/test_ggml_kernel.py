"""``ggml_moe_a8_vec`` and ``dequantize_ggml`` against the gguf numpy oracle.

Runs under ``TRITON_INTERPRET=1`` on CPU (conftest) or on a CUDA device.

Tolerance. The oracle is float64 ``dequant(W) @ q8_1(x)`` with the kernel's
Q8_1 rounding emulated bit for bit, so the only differences are float32
rounding in the kernel (f32 products of block scales with exact integer block
sums, accumulated over K) plus, on a GPU, the odd activation that rounds to
the neighbouring int8 because the device's x/d differs in the last ulp (one
such flip moves a dot product by d_a*|w| <~ 1/(127*K/2) of ``mag``). Both stay
far below ``RTOL_MAG = 2e-4`` of ``mag = |W| @ |q8_1(x)|``, the natural scale of a
dot product's rounding error (a relative-to-|y| bound would fail on dot
products that cancel to ~0). Half-precision outputs add the cast of y: one
ulp, 2^-10 (fp16) or 2^-7 (bf16) of |y| (one ulp, not half, because the
Triton interpreter's float32 -> bfloat16 cast truncates instead of rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _ggml_oracle import (
    ALL_TYPES,
    BLOCK_SIZE,
    dequantize,
    q8_1_roundtrip,
    random_blocks,
    reference_moe_a8_vec,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_core.errors import (
    IndexDTypeError,
    IndexOutOfRangeError,
    IndexShapeError,
    QuantTypeError,
    ShapeMismatchError,
)
from sgl_cuda.quantization import GGMLQuantType, dequantize_ggml, ggml_moe_a8_vec

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL_MAG = 2e-4
OUT_RTOL = {torch.float32: 0.0, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _case(
    qtype: int, e: int, row: int, k: int, tokens: int, top_k: int, seed: int = 0
) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed + 31 * qtype)
    w = random_blocks(qtype, e * row, k, rng).reshape(e, row, -1)
    x = torch.from_numpy(rng.standard_normal((tokens, k)).astype(np.float32))
    ids = torch.from_numpy(rng.integers(0, e, size=(tokens, top_k))).to(torch.int32)
    return w, x, ids


def _check(y: torch.Tensor, x: torch.Tensor, w: np.ndarray, ids: torch.Tensor, qtype: int) -> None:
    ref, mag = reference_moe_a8_vec(x, w, ids.numpy(), qtype)
    got = y.double().cpu().numpy()
    bound = RTOL_MAG * mag + OUT_RTOL[y.dtype] * np.abs(ref) + 1e-30
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"max err/bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("qtype", sorted(ALL_TYPES), ids=lambda t: ALL_TYPES[t])
def test_matches_oracle_every_type(qtype: int) -> None:
    # K: two 256-blocks for K-quants; 96 for legacy types (3 blocks, a partial
    # K tile). row=24 is not a multiple of the row tile, so masking is exercised.
    k = 512 if BLOCK_SIZE[qtype] == 256 else 96
    tokens, top_k, e, row = 3, 2, 3, 24
    w, x, ids = _case(qtype, e, row, k, tokens, top_k)
    y = ggml_moe_a8_vec(
        x.to(DEVICE), torch.from_numpy(w).to(DEVICE), ids.to(DEVICE), top_k, qtype, row, tokens
    )
    assert y.shape == (tokens * top_k, row)
    assert y.dtype == torch.float32
    _check(y, x, w, ids, qtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qtype", [GGMLQuantType.Q4_0, GGMLQuantType.Q4_K])
def test_half_precision_inputs(qtype: GGMLQuantType, dtype: torch.dtype) -> None:
    k = BLOCK_SIZE[qtype]
    w, x, ids = _case(int(qtype), 2, 16, k, 2, 2, seed=5)
    xh = x.to(dtype)
    y = ggml_moe_a8_vec(
        xh.to(DEVICE), torch.from_numpy(w).to(DEVICE), ids.to(DEVICE), 2, qtype, 16, 2
    )
    assert y.dtype == dtype
    # the oracle quantizes the same half-precision values (widened to float32)
    _check(y, xh.float(), w, ids, int(qtype))


def test_row_is_pair_of_token_and_expert() -> None:
    # Y[t*top_k + k] uses token t and expert topk_ids[t, k]: a one-hot x picks column c
    qtype, k, e, row = GGMLQuantType.Q8_0, 32, 4, 8
    w, _, _ = _case(int(qtype), e, row, k, 1, 1, seed=9)
    x = torch.zeros(2, k)
    x[0, 3] = 1.0
    x[1, 7] = 2.0
    ids = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    y = ggml_moe_a8_vec(
        x.to(DEVICE), torch.from_numpy(w).to(DEVICE), ids.to(DEVICE), 2, qtype, row, 2
    ).cpu()
    dense = dequantize(w, int(qtype))  # (E, row, K)
    expect = np.stack([dense[2][:, 3], dense[0][:, 3], 2 * dense[1][:, 7], 2 * dense[3][:, 7]])
    np.testing.assert_allclose(y.double().numpy(), expect, rtol=1e-6, atol=1e-7)


def test_activation_quantization_matches_q8_1() -> None:
    import os

    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the Triton interpreter")
    from sgl_cuda._triton.ggml import quantize_q8_1

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 96)).astype(np.float32) * 4
    x[1, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    x[2, :32] = np.float32(127.0 / 2) * np.sign(x[2, :32])  # exact .5 ties round away from zero
    q, d = quantize_q8_1(torch.from_numpy(x).to(DEVICE))
    q_ref, d_ref, _ = q8_1_roundtrip(x)
    np.testing.assert_array_equal(d.cpu().numpy(), d_ref)
    np.testing.assert_array_equal(q.cpu().numpy().astype(np.int64), q_ref)


@pytest.mark.parametrize("qtype", sorted(ALL_TYPES), ids=lambda t: ALL_TYPES[t])
def test_dequantize_ggml_is_exact(qtype: int) -> None:
    rng = np.random.default_rng(qtype)
    k = 2 * BLOCK_SIZE[qtype]
    w = random_blocks(qtype, 6, k, rng).reshape(2, 3, -1)
    got = dequantize_ggml(torch.from_numpy(w), qtype)
    assert got.shape == (2, 3, k)
    assert got.dtype == torch.float32
    # same float32 operations as gguf's numpy reference: bit-exact
    np.testing.assert_array_equal(got.numpy(), dequantize(w, qtype).astype(np.float32))


def _args() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Valid Q4_0 arguments: x (2, 32), w (E=2, row=4, 18 B), topk_ids (2, 1)."""
    qtype, k, e, row, tokens, top_k = 2, 32, 2, 4, 2, 1
    w, x, ids = _case(qtype, e, row, k, tokens, top_k)
    return x, torch.from_numpy(w), ids


@pytest.mark.parametrize("bad", [0, 1, 4, 5, 9, 15, 16, 99, -1])
def test_unsupported_type_names_supported(bad: int) -> None:
    x, w, ids = _args()
    with pytest.raises(QuantTypeError, match=r"Q4_0=2.*Q4_K=12.*Q6_K=14"):
        ggml_moe_a8_vec(x, w, ids, 1, bad, 4, 2)
    with pytest.raises(QuantTypeError):
        dequantize_ggml(w, bad)


def test_shape_and_dtype_errors() -> None:
    x, w, ids = _args()
    with pytest.raises(ShapeMismatchError, match="multiple of the Q4_0 block size"):
        ggml_moe_a8_vec(torch.zeros(2, 48), w, ids, 1, 2, 4, 2)
    with pytest.raises(ShapeMismatchError, match="bytes per row"):
        ggml_moe_a8_vec(x, w, ids, 1, GGMLQuantType.Q4_1, 4, 2)  # 18-byte rows, Q4_1 needs 20
    with pytest.raises(ShapeMismatchError, match="row=5"):
        ggml_moe_a8_vec(x, w, ids, 1, 2, 5, 2)
    with pytest.raises(ShapeMismatchError, match="tokens=3"):
        ggml_moe_a8_vec(x, w, ids, 1, 2, 4, 3)
    with pytest.raises(IndexShapeError):
        ggml_moe_a8_vec(x, w, ids, 2, 2, 4, 2)
    with pytest.raises(IndexDTypeError):
        ggml_moe_a8_vec(x, w, ids.long(), 1, 2, 4, 2)
    with pytest.raises(TypeError, match="x must be"):
        ggml_moe_a8_vec(x.double(), w, ids, 1, 2, 4, 2)
    with pytest.raises(TypeError, match="uint8"):
        ggml_moe_a8_vec(x, w.to(torch.int8), ids, 1, 2, 4, 2)
    with pytest.raises(ShapeMismatchError, match="E, row, row_bytes"):
        ggml_moe_a8_vec(x, w[0], ids, 1, 2, 4, 2)
    with pytest.raises(IndexOutOfRangeError, match=r"\[0, 2\)"):
        ggml_moe_a8_vec(x, w, torch.tensor([[0], [2]], dtype=torch.int32), 1, 2, 4, 2)
    with pytest.raises(IndexOutOfRangeError):
        ggml_moe_a8_vec(x, w, torch.tensor([[-1], [0]], dtype=torch.int32), 1, 2, 4, 2)


def test_empty_batch() -> None:
    x, w, _ = _args()
    y = ggml_moe_a8_vec(x[:0], w, torch.zeros((0, 2), dtype=torch.int32), 2, 2, 4, 0)
    assert y.shape == (0, 4)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    qtype=st.sampled_from(sorted(ALL_TYPES)),
    tokens=st.integers(1, 3),
    top_k=st.integers(1, 3),
    e=st.integers(1, 4),
    row=st.integers(1, 40),
    n_blocks=st.integers(1, 3),
)
def test_shapes_property(
    *, qtype: int, tokens: int, top_k: int, e: int, row: int, n_blocks: int
) -> None:
    # odd row counts (down to one row) and K of 1..3 blocks; ids may repeat within a token
    k = n_blocks * BLOCK_SIZE[qtype]
    w, x, ids = _case(qtype, e, row, k, tokens, top_k, seed=row)
    y = ggml_moe_a8_vec(
        x.to(DEVICE), torch.from_numpy(w).to(DEVICE), ids.to(DEVICE), top_k, qtype, row, tokens
    )
    _check(y, x, w, ids, qtype)


@pytest.mark.parametrize("tile", [(8, 256, 2), (16, 512, 4), (32, 256, 8)])
def test_tile_override_matches_oracle(tile: tuple[int, int, int]) -> None:
    """``moe_a8_vec(tile=...)`` (the tuning sweep's launch): every tile covers every row."""
    from sgl_cuda._triton.ggml import moe_a8_vec, quantize_q8_1
    from sgl_cuda.quantization._types import block_format

    qtype = int(GGMLQuantType.Q4_K)
    fmt = block_format(qtype)
    tokens, top_k, e, row, k = 2, 2, 3, 40, 512  # 40 rows: a partial last tile
    w, x, ids = _case(qtype, e, row, k, tokens, top_k, seed=5)
    xq, xd = quantize_q8_1(x.to(DEVICE))
    out = torch.full((tokens * top_k, row), float("nan"), device=DEVICE)
    moe_a8_vec(
        xq,
        xd,
        torch.from_numpy(w).to(DEVICE),
        ids.to(DEVICE).flatten(),
        out,
        top_k=top_k,
        quant_type=qtype,
        block_size=fmt.block_size,
        block_bytes=fmt.block_bytes,
        group_size=fmt.group_size,
        tile=tile,
    )
    _check(out, x, w, ids, qtype)
