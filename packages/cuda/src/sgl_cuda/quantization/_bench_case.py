"""The GGML method as an ``sgl-bench moe`` case (entry point ``sgl.moe_bench_cases``)."""

from __future__ import annotations

import os
import sys

import torch

from sgl_core import MoEWeights
from sgl_core.backend import MoEBenchCase
from sgl_core.errors import BackendUnavailableError
from sgl_cuda.quantization._method import GGMLExpertBank, GGMLMoEMethod
from sgl_cuda.quantization._types import GGMLQuantType, dequantize_ggml

__all__ = ["ggml_q8_0_case"]

_Q8_0_BLOCK = 34  # f16 scale + 32 int8 weights


def _q8_0_bank(experts: int, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    blocks = experts * rows * (cols // 32)
    scale = (torch.rand(blocks, 1, generator=gen) * 0.01 + 0.005).to(torch.float16)
    quants = torch.randint(-127, 128, (blocks, 32), generator=gen, dtype=torch.int8)
    raw = torch.cat([scale.view(torch.uint8), quants.view(torch.uint8)], dim=1)
    return raw.reshape(experts, rows, (cols // 32) * _Q8_0_BLOCK)


def ggml_q8_0_case(device: torch.device, small: bool) -> MoEBenchCase:
    """Q8_0 experts for ``GGMLMoEMethod``; on CPU, tiny and under Triton's interpreter.

    On a machine without CUDA this switches the process to the Triton
    interpreter (``TRITON_INTERPRET=1``) if no kernel was compiled yet: the
    bench process is then checking correctness, not speed. Where CUDA is
    present the switch would send every later launch of the process, GPU ones
    included, to the interpreter, so a CPU case there needs the variable set
    from the start.
    """
    if device.type == "cuda":
        hidden, inter, experts = (1024, 512, 8) if small else (2048, 1024, 16)
    elif device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            if torch.cuda.is_available():
                raise BackendUnavailableError(
                    "the GGML case on cpu needs TRITON_INTERPRET=1 from process start; "
                    "this machine has CUDA: run it on device='cuda'"
                )
            if "sgl_cuda._triton.ggml" in sys.modules:
                raise BackendUnavailableError(
                    "GGML kernels were built for a GPU; CPU tensors need TRITON_INTERPRET=1"
                )
            os.environ["TRITON_INTERPRET"] = "1"
        hidden, inter, experts = 64, 32, 4
    else:
        raise BackendUnavailableError(f"the GGML method runs on cuda (or cpu), not {device}")
    gen = torch.Generator().manual_seed(2)
    gate_up = _q8_0_bank(experts, 2 * inter, hidden, gen).to(device)
    down = _q8_0_bank(experts, hidden, inter, gen).to(device)
    reference = MoEWeights(
        dequantize_ggml(gate_up, GGMLQuantType.Q8_0), dequantize_ggml(down, GGMLQuantType.Q8_0)
    )
    bank = GGMLExpertBank(gate_up, GGMLQuantType.Q8_0, down, GGMLQuantType.Q8_0)
    note = "" if device.type == "cuda" else "Triton interpreter on CPU: correctness only"
    return MoEBenchCase("ggml_q8_0", GGMLMoEMethod(), bank, reference, note)
