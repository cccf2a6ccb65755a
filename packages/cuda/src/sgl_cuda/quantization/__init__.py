"""GGML (GGUF block-quantized) MoE for CUDA: the ``ggml_moe_a8_vec`` and
expert-grouped ``ggml_moe_a8`` kernels (with ``moe_align_block_size``),
:class:`GGMLMoEMethod`, and a loader of expert banks from ``.gguf`` files.

Importing this package imports neither Triton nor ``gguf``: the kernel module
is imported at the first launch and ``gguf`` inside the loader.
"""

from __future__ import annotations

from sgl_core.backend import publish_names as _publish_names
from sgl_cuda.quantization._align import moe_align_block_size
from sgl_cuda.quantization._gguf_loader import load_ggml_expert_bank
from sgl_cuda.quantization._method import GGMLExpertBank, GGMLMoEMethod
from sgl_cuda.quantization._ops import ggml_moe_a8, ggml_moe_a8_vec, ggml_moe_get_block_size
from sgl_cuda.quantization._types import GGMLQuantType, dequantize_ggml

__all__ = [
    "GGMLExpertBank",
    "GGMLMoEMethod",
    "GGMLQuantType",
    "dequantize_ggml",
    "ggml_moe_a8",
    "ggml_moe_a8_vec",
    "ggml_moe_get_block_size",
    "load_ggml_expert_bank",
    "moe_align_block_size",
]

_publish_names(__name__, globals())  # sgl_cuda.quantization.GGMLMoEMethod in reports
del _publish_names
