"""Independent numpy oracle for the GGML kernels, built on the ``gguf`` package.

``gguf.quants`` documents every block format in numpy: it quantizes the legacy
formats and dequantizes all of them. It has no K-quant quantizer, so K-quant
test weights (and IQ4_NL/IQ4_XS ones, which it cannot quantize either) are
random (valid) block bytes with small, finite f16 scales.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

gguf: Any = pytest.importorskip("gguf")

LEGACY = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0"}
KQUANT = {10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
IQUANT = {20: "IQ4_NL", 23: "IQ4_XS"}
ALL_TYPES = {**LEGACY, **KQUANT, **IQUANT}
BLOCK_SIZE = {t: (32 if t in LEGACY or t == 20 else 256) for t in ALL_TYPES}

# byte offsets of the f16 (super-)block scale (d) and, where present, min scale (dmin)
_RANDOM_F16 = {10: (80, 82), 11: (108,), 12: (0, 2), 13: (0, 2), 14: (208,), 20: (0,), 23: (0,)}


def _qtype(t: int) -> Any:
    return gguf.GGMLQuantizationType(t)


def random_blocks(qtype: int, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 ``(rows, row_bytes)``: ``rows`` rows of ``k`` weights in format ``qtype``."""
    assert k % BLOCK_SIZE[qtype] == 0, (qtype, k)
    if qtype in LEGACY:
        data = rng.standard_normal((rows, k)).astype(np.float32)
        out: np.ndarray = gguf.quants.quantize(data, _qtype(qtype))
        return out
    qk, block_bytes = gguf.GGML_QUANT_SIZES[_qtype(qtype)]
    nb = k // qk
    blocks = rng.integers(0, 256, size=(rows, nb, block_bytes), dtype=np.uint8)
    for off in _RANDOM_F16[qtype]:
        scale = rng.uniform(2e-4, 2e-3, size=(rows, nb)).astype(np.float16)
        blocks[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return blocks.reshape(rows, -1)


def dequantize(blocks: np.ndarray, qtype: int) -> np.ndarray:
    """float64 weights of ``(..., row_bytes)`` block bytes."""
    return np.asarray(
        gguf.quants.dequantize(np.ascontiguousarray(blocks), _qtype(qtype)), dtype=np.float64
    )


def q8_1_roundtrip(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Emulate Q8_1 activation quantization of float32 rows ``(tokens, K)``.

    Returns ``(q int, d float32 per 32, dequantized float64)``: ``d = amax/127``
    and ``q = roundf(x / d)`` (half away from zero, gguf's ``np_roundf``), all in
    float32 like the kernel.
    """
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))
    q = gguf.quants.np_roundf(blocks / safe).astype(np.int64)
    deq = q.astype(np.float64) * d.astype(np.float64)
    return q.reshape(x.shape), d[..., 0], deq.reshape(x.shape)


def reference_moe_a8_vec(
    x: torch.Tensor, w: np.ndarray, topk_ids: np.ndarray, qtype: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(Y, mag)`` float64: Y[t*top_k+k] = dequant(w[ids[t,k]]) @ q8_1(x[t]).

    ``mag`` = |dequant(w)| @ |q8_1(x)|, the scale that bounds rounding error.
    """
    _, _, xdeq = q8_1_roundtrip(x.float().numpy())
    wdeq = dequantize(w, qtype)  # (E, row, K)
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1)
    xs = xdeq[np.arange(ids.size) // top_k]  # (pairs, K)
    y = np.einsum("prk,pk->pr", wdeq[ids], xs)
    mag = np.einsum("prk,pk->pr", np.abs(wdeq[ids]), np.abs(xs))
    return y, mag


def routing(tokens: int, top_k: int, e: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized random ``(topk_weights, topk_ids int32)`` with distinct experts per token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(tokens)]).to(
        torch.int32
    )
    weights = torch.rand(tokens, top_k, generator=g)
    return weights / weights.sum(-1, keepdim=True), ids


def float_reference(
    x: np.ndarray,
    wgu: np.ndarray,
    wd: np.ndarray,
    weights: np.ndarray,
    ids: np.ndarray,
    *,
    emulate: bool,
) -> np.ndarray:
    """float64 MoE on dense weights; ``emulate`` adds the kernel's two Q8_1 roundings."""
    inter = wgu.shape[1] // 2
    if emulate:
        x = q8_1_roundtrip(x.astype(np.float32))[2]
    out = np.zeros((x.shape[0], wd.shape[1]))
    for t in range(x.shape[0]):
        for k, e in enumerate(ids[t]):
            gu = wgu[e] @ x[t]
            act = gu[:inter] / (1.0 + np.exp(-gu[:inter])) * gu[inter:]
            if emulate:
                act = q8_1_roundtrip(act[None].astype(np.float32))[2][0]
            out[t] += weights[t, k] * (wd[e] @ act)
    return out
