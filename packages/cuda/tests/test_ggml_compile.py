"""The GGML kernels compile for sm_90 (Hopper) on a machine without a GPU.

The interpreter runs constructs a real compile rejects (``tl.dot`` shapes and
dtypes, scalar/tensor mixing in control flow), so the CPU suite would not catch
them. This lowers the batched kernel for every type, and the vec kernel for
the IQ4 types it gained, through Triton's NVIDIA backend to a cubin (ptxas
ships with the triton wheel). Skipped where a GPU runs the kernels for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU suite compiles them for real"),
]

# Runs in a fresh interpreter without TRITON_INTERPRET: under it ``triton.jit``
# builds interpreter objects, which the compiler cannot lower.
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from sgl_cuda._triton.ggml import _moe_a8_mmq_kernel, _moe_a8_vec_kernel, default_tile
    from sgl_cuda.quantization import GGMLQuantType
    from sgl_cuda.quantization._types import block_format

    PTR = {"xq_ptr": "*i8", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "w_ptr": "*u8", "ids_ptr": "*i32",
           "sorted_ptr": "*i32", "expert_ids_ptr": "*i32", "npad_ptr": "*i32",
           "out_ptr": "*bf16"}

    def compile_(kernel, consts, num_warps):
        names = kernel.arg_names
        sig = {n: PTR.get(n, "constexpr" if n in consts else "i32") for n in names}
        sig["stride_we"] = "i64"
        src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
        return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps}).asm

    results = {}
    for t in GGMLQuantType:
        bm, bn, bk, warps = default_tile(int(t))
        f = block_format(t)
        c = {"QTYPE": int(t), "QK": f.block_size, "BB": f.block_bytes, "G": f.group_size}
        try:
            asm = compile_(_moe_a8_mmq_kernel, {**c, "BLOCK_M": bm, "BLOCK_N": bn,
                                                "BLOCK_K": bk}, warps)
            results["mmq " + t.name] = "mma" in asm["ptx"] and len(asm["cubin"]) > 0
            if t.name.startswith("IQ4"):
                asm = compile_(_moe_a8_vec_kernel, {**c, "BLOCK_N": 16, "BLOCK_K": 256}, 4)
                results["vec " + t.name] = len(asm["cubin"]) > 0
        except Exception as exc:
            results[t.name] = repr(exc)[:500]
    print(json.dumps(results))
    """
)


def test_kernels_compile_for_sm90() -> None:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    # every type's batched kernel ran its int8 tile product on the tensor cores (mma)
    assert len(results) == 14, results
    assert all(v is True for v in results.values()), results
