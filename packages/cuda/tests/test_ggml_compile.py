"""The GGML kernels compile for sm_90 (Hopper) on a machine without a GPU.

The interpreter runs constructs a real compile rejects (``tl.dot`` shapes and
dtypes, scalar/tensor mixing in control flow), so the CPU suite would not catch
them. This lowers the batched kernel for every type, and the vec kernel for
the IQ4 types it gained, through Triton's NVIDIA backend to a cubin (ptxas
ships with the triton wheel). Skipped where a GPU runs the kernels for real.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from sgl_cuda.quantization import GGMLQuantType
from sgl_cuda.quantization._types import block_format

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU suite compiles them for real"),
]

_PTR = {
    "xq_ptr": "*i8",
    "xd_ptr": "*fp32",
    "w_ptr": "*u8",
    "ids_ptr": "*i32",
    "sorted_ptr": "*i32",
    "expert_ids_ptr": "*i32",
    "npad_ptr": "*i32",
    "out_ptr": "*bf16",
}


def _compile(kernel: Any, constexprs: dict[str, int], num_warps: int) -> dict[str, Any]:
    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
        pytest.skip("this Triton has no NVIDIA backend")
    names = kernel.arg_names
    sig = {n: _PTR.get(n, "constexpr" if n in constexprs else "i32") for n in names}
    sig["stride_we"] = "i64"
    src = ASTSource(
        kernel,
        sig,
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}
    )
    asm: dict[str, Any] = compiled.asm
    return asm


def _consts(qtype: GGMLQuantType) -> dict[str, int]:
    fmt = block_format(qtype)
    return {"QTYPE": int(qtype), "QK": fmt.block_size, "BB": fmt.block_bytes, "G": fmt.group_size}


@pytest.fixture(autouse=True)
def _compiled_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernels' jit objects do not care; the backend must not think it interprets
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert os.environ.get("TRITON_INTERPRET") is None


@pytest.mark.parametrize("qtype", list(GGMLQuantType), ids=lambda t: t.name)
def test_batched_kernel_compiles_for_sm90(qtype: GGMLQuantType) -> None:
    from sgl_cuda._triton.ggml_mmq import GPU_TILE_DEFAULT, _moe_a8_mmq_kernel

    bm, bn, bk, warps = GPU_TILE_DEFAULT
    consts = {**_consts(qtype), "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    asm = _compile(_moe_a8_mmq_kernel, consts, warps)
    assert "mma" in asm["ptx"]  # the int8 tile product runs on the tensor cores
    assert asm["cubin"]


@pytest.mark.parametrize("qtype", [GGMLQuantType.IQ4_NL, GGMLQuantType.IQ4_XS], ids=str)
def test_vec_kernel_compiles_for_sm90(qtype: GGMLQuantType) -> None:
    from sgl_cuda._triton.ggml import _moe_a8_vec_kernel

    consts = {**_consts(qtype), "BLOCK_N": 16, "BLOCK_K": 256}
    assert _compile(_moe_a8_vec_kernel, consts, 4)["cubin"]
