"""GGML quantization type ids, their block geometry (docs/design.md, section 9) and
``dequantize_ggml``, a dense torch dequantization: a benchmark baseline (the MoE
method's kernels dot the blocks directly) and a readable statement of each layout.
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass

import torch

from sgl_core.errors import ArgumentTypeError, QuantTypeError, ShapeMismatchError

__all__ = ["BlockFormat", "GGMLQuantType", "block_format", "dequantize_ggml", "resolve_quant_type"]


class GGMLQuantType(enum.IntEnum):
    """GGML tensor type ids (``ggml_type``) of the block formats the kernel implements."""

    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    IQ4_XS = 23


@dataclass(frozen=True)
class BlockFormat:
    """Geometry of one quantized block.

    ``block_size`` weights are stored in ``block_bytes`` bytes. ``group_size``
    is the span sharing one scale (and min): 32 for the legacy formats and
    Q4_K/Q5_K, 16 for Q2_K/Q3_K/Q6_K.
    """

    block_size: int
    block_bytes: int
    group_size: int

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of ``k`` weights (``k`` a multiple of ``block_size``)."""
        return k // self.block_size * self.block_bytes


_FORMATS: dict[GGMLQuantType, BlockFormat] = {
    GGMLQuantType.Q4_0: BlockFormat(32, 18, 32),
    GGMLQuantType.Q4_1: BlockFormat(32, 20, 32),
    GGMLQuantType.Q5_0: BlockFormat(32, 22, 32),
    GGMLQuantType.Q5_1: BlockFormat(32, 24, 32),
    GGMLQuantType.Q8_0: BlockFormat(32, 34, 32),
    GGMLQuantType.Q2_K: BlockFormat(256, 84, 16),
    GGMLQuantType.Q3_K: BlockFormat(256, 110, 16),
    GGMLQuantType.Q4_K: BlockFormat(256, 144, 32),
    GGMLQuantType.Q5_K: BlockFormat(256, 176, 32),
    GGMLQuantType.Q6_K: BlockFormat(256, 210, 16),
    GGMLQuantType.IQ4_NL: BlockFormat(32, 18, 32),
    GGMLQuantType.IQ4_XS: BlockFormat(256, 136, 32),
}


# GGML type ids this package knows by name but does not implement, so the error
# names what the file holds (ids per ggml's ``ggml_type``).
_UNSUPPORTED_NAMES = {
    0: "F32",
    1: "F16",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    21: "IQ3_S",
    22: "IQ2_S",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    30: "BF16",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}


def _supported() -> str:
    return ", ".join(f"{t.name}={t.value}" for t in GGMLQuantType)


def resolve_quant_type(quant_type: int, argument: str = "quant_type") -> GGMLQuantType:
    """The :class:`GGMLQuantType` of a GGML type id; ``QuantTypeError`` naming the supported ids."""
    try:
        if isinstance(quant_type, bool):
            raise TypeError
        value = operator.index(quant_type)  # int, IntEnum (gguf's types too), numpy ints
    except TypeError:
        raise QuantTypeError(
            f"{argument} must be an int GGML type id, got {type(quant_type).__name__}; "
            f"supported: {_supported()}"
        ) from None
    try:
        return GGMLQuantType(value)
    except ValueError:
        known = _UNSUPPORTED_NAMES.get(value)
        what = (
            f"is GGML type {known}, which these kernels do not implement"
            if known
            else ("is not a supported GGML quant type")
        )
        raise QuantTypeError(f"{argument}={value} {what}; supported: {_supported()}") from None


def block_format(quant_type: int) -> BlockFormat:
    """Block geometry of a supported GGML type id."""
    return _FORMATS[resolve_quant_type(quant_type)]


_T = GGMLQuantType


def _f16(b: torch.Tensor, off: int) -> torch.Tensor:
    """The little-endian f16 at byte ``off`` of each block, as float32 ``(n, 1)``."""
    return b[:, off : off + 2].contiguous().view(torch.float16).float()


def _nibbles32(b: torch.Tensor, off: int) -> torch.Tensor:
    """32 4-bit values of a legacy block: low nibbles then high nibbles of 16 bytes."""
    qs = b[:, off : off + 16].int()
    return torch.cat([qs & 15, qs >> 4], dim=1)


# IQ4_NL/IQ4_XS: the non-linear value of each 4-bit index (ggml's kvalues_iq4nl)
_IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4(nibbles: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(_IQ4_VALUES, dtype=torch.float32, device=nibbles.device)
    return table[nibbles.long()]


def _decode(b: torch.Tensor, qtype: GGMLQuantType) -> torch.Tensor:
    """float32 ``(n_blocks, block_size)`` from uint8 ``(n_blocks, block_bytes)``."""
    dev = b.device
    if qtype == _T.IQ4_NL:
        return _f16(b, 0) * _iq4(_nibbles32(b, 2))
    if qtype == _T.IQ4_XS:
        j = torch.arange(8, device=dev)
        lo = (b[:, 4 + j // 2].int() >> ((j % 2) * 4)) & 15
        hi = (b[:, 2 + j // 4].int() >> ((j % 4) * 2)) & 3
        dl = _f16(b, 0) * ((lo | (hi << 4)) - 32).float()  # (n, 8): one scale per 32
        qs = b[:, 8:136].reshape(-1, 8, 16).int()
        q = _iq4(torch.cat([qs & 15, qs >> 4], dim=2))  # (n, 8, 32)
        return (dl[:, :, None] * q).reshape(-1, 256)
    if qtype in (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1):
        off = 2 if qtype in (_T.Q4_0, _T.Q5_0) else 4  # past d (*_0) or d and m (*_1)
        five = qtype in (_T.Q5_0, _T.Q5_1)  # a u32 of high bits at off, the nibbles after it
        q = _nibbles32(b, off + 4 * five)
        if five:
            i = torch.arange(32, device=dev)
            q = q | (((b[:, off + i // 8].int() >> (i % 8)) & 1) << 4)  # bit i of that u32
        if off == 2:  # *_0: no min, values centred on half the range
            return _f16(b, 0) * (q.float() - (16 if five else 8))
        return _f16(b, 0) * q.float() + _f16(b, 2)
    if qtype == _T.Q8_0:
        return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).float()

    i = torch.arange(256, device=dev)
    g16 = i // 16
    if qtype == _T.Q2_K:
        q = (b[:, 16 + (i // 128) * 32 + i % 32].int() >> (((i % 128) // 32) * 2)) & 3
        sc = b[:, g16].int()
        d, dmin = _f16(b, 80), _f16(b, 82)
        return (d * (sc & 15).float()) * q.float() - dmin * (sc >> 4).float()
    if qtype == _T.Q3_K:
        lo = (b[:, 32 + (i // 128) * 32 + i % 32].int() >> (((i % 128) // 32) * 2)) & 3
        hb = (b[:, i % 32].int() >> (i // 32)) & 1
        q = lo - 4 + 4 * hb
        j = torch.arange(16, device=dev)
        sl = (b[:, 96 + j % 8].int() >> ((j // 8) * 4)) & 15
        sh = (b[:, 104 + j % 4].int() >> ((j // 4) * 2)) & 3
        sc = ((sl | (sh << 4)) - 32).float()
        return (_f16(b, 108) * sc)[:, g16] * q.float()
    if qtype in (_T.Q4_K, _T.Q5_K):
        qs_off = 16 if qtype == _T.Q4_K else 48
        q = (b[:, qs_off + (i // 64) * 32 + i % 32].int() >> (((i // 32) % 2) * 4)) & 15
        if qtype == _T.Q5_K:
            q = q | (((b[:, 16 + i % 32].int() >> (i // 32)) & 1) << 4)
        s = b[:, 4:16].int()  # eight 6-bit (scale, min) pairs packed in bytes 4..15
        j = torch.arange(8, device=dev)
        a, bb, c = s[:, j], s[:, j + 4], s[:, j % 4]
        sc = torch.where(j < 4, a & 63, (bb & 15) | ((c >> 6) << 4)).float()
        mn = torch.where(j < 4, bb & 63, (bb >> 4) | ((a >> 6) << 4)).float()
        g32 = i // 32
        return (_f16(b, 0) * sc)[:, g32] * q.float() - (_f16(b, 2) * mn)[:, g32]
    # Q6_K
    lo = (b[:, (i // 128) * 64 + i % 64].int() >> (((i % 128) // 64) * 4)) & 15
    hi = (b[:, 128 + (i // 128) * 32 + i % 32].int() >> (((i % 128) // 32) * 2)) & 3
    q = (lo | (hi << 4)) - 32
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    return (_f16(b, 208) * sc)[:, g16] * q.float()


def dequantize_ggml(
    w: torch.Tensor, quant_type: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dense weights ``(..., K)`` of uint8 GGUF block bytes ``w (..., row_bytes)``.

    A torch implementation (any device) for baselines; values are exact float32
    products of the block scales and quant ints, then cast to ``dtype``.
    """
    qtype = resolve_quant_type(quant_type)
    fmt = block_format(qtype)
    if not isinstance(w, torch.Tensor) or w.dtype != torch.uint8:
        raise ArgumentTypeError("w must be a uint8 tensor of GGUF block bytes")
    if w.dim() < 1 or w.shape[-1] % fmt.block_bytes:
        raise ShapeMismatchError(
            f"w's last dim ({tuple(w.shape)}) must be a multiple of the {qtype.name} "
            f"block size of {fmt.block_bytes} bytes"
        )
    n_blocks = w.shape[-1] // fmt.block_bytes
    blocks = w.reshape(-1, fmt.block_bytes)
    out = (
        _decode(blocks, qtype)
        if blocks.shape[0]
        else blocks.new_empty((0, fmt.block_size), dtype=torch.float32)
    )
    return out.reshape(*w.shape[:-1], n_blocks * fmt.block_size).to(dtype)
