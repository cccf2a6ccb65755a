"""The MHA transfer kernel compiles for sm_90 (Hopper) on a machine without a GPU.

The interpreter accepts constructs a real compile rejects, so this lowers
``_copy_rows_kernel`` through Triton's NVIDIA backend to a cubin (ptxas
ships with the triton wheel) for every side pairing ``sgl_cuda.kvcacheio``
launches, both grid orders and a masked tile. Skipped where a GPU runs the
kernels for real.
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

# A fresh interpreter without TRITON_INTERPRET: under it ``triton.jit`` builds
# interpreter objects, which the compiler cannot lower.
_SCRIPT = textwrap.dedent(
    """
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from sgl_cuda._triton.kvcacheio import _copy_rows_kernel as kernel

    # (src table, dst table, src page_head, dst page_head): every pairing kvcacheio launches
    PAIRS = {"lf_lf": (0, 0, 0, 0), "pf_lf": (0, 0, 0, 0), "ph_lf": (0, 0, 1, 0),
             "tbl_tbl": (1, 1, 0, 0), "tbl_pf": (1, 0, 0, 0), "tbl_ph": (1, 0, 0, 1)}
    results = {}
    for name, (st, dt, sph, dph) in PAIRS.items():
        for inner, words, mask in ((False, 64, False), (True, 6, True)):
            consts = {"WORDS": words, "HEAD_WORDS": words // 2, "SRC_TABLE": bool(st),
                      "DST_TABLE": bool(dt), "SRC_PH": bool(sph), "DST_PH": bool(dph),
                      "BLOCK_R": 16, "BLOCK_W": 8 if mask else 64, "MASK_W": mask,
                      "LAYERS_INNER": inner}
            names = kernel.arg_names
            sig = {n: ("constexpr" if n in consts else "i64") for n in names}
            sig.update(src="*u64" if st else "*u8", dst="*u64" if dt else "*u8",
                       src_idx="*i64", dst_idx="*i64")
            src = ASTSource(kernel, sig, constexprs={(names.index(k),): v
                                                     for k, v in consts.items()})
            key = f"{name} inner={inner}"
            try:
                asm = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                     options={"num_warps": 4}).asm
                results[key] = len(asm["cubin"]) > 0
            except Exception as exc:
                results[key] = repr(exc)[:500]
    print(json.dumps(results))
    """
)


def test_kernel_compiles_for_sm90() -> None:
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
    assert len(results) == 12
    assert all(v is True for v in results.values()), results
