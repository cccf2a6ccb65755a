"""GGML quantization type ids and their block geometry (docs/design.md, section 9)."""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass

from sgl_core.errors import QuantTypeError

__all__ = ["BlockFormat", "GGMLQuantType", "block_format", "resolve_quant_type"]


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
