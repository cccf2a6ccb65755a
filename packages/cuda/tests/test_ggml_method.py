"""``GGMLMoEMethod``: end to end against float references, and the MoE combine.

Tolerances. ``test_matches_float_reference`` compares with float64 math on the
gguf-dequantized weights and unquantized activations; the kernel quantizes
activations to Q8_1 twice (x, then SiLU(gate)*up), each element off by up to
d/2 = amax/254 of its 32-block, about 0.5% of a dot product per stage, so the
bound is 3% in relative Frobenius norm. ``test_matches_q8_1_emulation`` repeats
the Q8_1 rounding in the reference, leaving float32 accumulation and the odd
intermediate activation rounding the other way: 2e-4 relative norm.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import torch
from _ggml_oracle import BLOCK_SIZE, dequantize, float_reference, random_blocks, routing

from sgl_core import MoEWeights, TorchMoEMethod, maybe_fuse_routed_scale_and_shared_add
from sgl_core.errors import IndexShapeError, QuantTypeError, ShapeMismatchError
from sgl_cuda.quantization import GGMLExpertBank, GGMLMoEMethod, GGMLQuantType

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
Q = GGMLQuantType


def make_bank(
    gu_type: GGMLQuantType,
    down_type: GGMLQuantType,
    e: int,
    hidden: int,
    inter: int,
    *,
    seed: int = 0,
) -> tuple[GGMLExpertBank, np.ndarray, np.ndarray]:
    """A random bank plus its float64 gguf-dequantized ``(E, 2I, H)`` and ``(E, H, I)``."""
    rng = np.random.default_rng(seed)
    gu = random_blocks(int(gu_type), e * 2 * inter, hidden, rng).reshape(e, 2 * inter, -1)
    down = random_blocks(int(down_type), e * hidden, inter, rng).reshape(e, hidden, -1)
    bank = GGMLExpertBank(torch.from_numpy(gu), gu_type, torch.from_numpy(down), down_type)
    return bank, dequantize(gu, int(gu_type)), dequantize(down, int(down_type))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


CASES = [(Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q5_1), (Q.Q4_0, Q.Q4_K)]


@pytest.mark.parametrize(("gu_type", "down_type"), CASES, ids=lambda t: t.name)
def test_matches_float_reference(gu_type: GGMLQuantType, down_type: GGMLQuantType) -> None:
    hidden, inter, e, tokens, top_k = 256, BLOCK_SIZE[int(down_type)], 4, 3, 2
    bank, wgu, wd = make_bank(gu_type, down_type, e, hidden, inter)
    weights, ids = routing(tokens, top_k, e)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1))
    y = (
        GGMLMoEMethod()
        .apply(bank.to(DEVICE), x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE))
        .cpu()
    )
    assert y.shape == (tokens, hidden)
    assert y.dtype == x.dtype
    ref = float_reference(
        x.double().numpy(), wgu, wd, weights.double().numpy(), ids.numpy(), emulate=False
    )
    assert _rel(y.double().numpy(), ref) < 3e-2
    emulated = float_reference(
        x.numpy(), wgu, wd, weights.double().numpy(), ids.numpy(), emulate=True
    )
    assert _rel(y.double().numpy(), emulated) < 2e-4


def test_agrees_with_torch_reference_method_fp16_int64_ids() -> None:
    # same bank dequantized (by gguf) into sgl_core's unquantized reference method
    bank, wgu, wd = make_bank(Q.Q5_K, Q.Q8_0, 3, 256, 32, seed=4)
    weights, ids = routing(2, 2, 3, seed=4)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(5)).half()
    y = (
        GGMLMoEMethod()
        .apply(bank.to(DEVICE), x.to(DEVICE), weights.to(DEVICE), ids.long().to(DEVICE))
        .cpu()
    )
    assert y.dtype == torch.float16
    ref_layer = MoEWeights(torch.from_numpy(wgu).float(), torch.from_numpy(wd).float())
    ref = TorchMoEMethod().apply(ref_layer, x.float(), weights, ids)
    assert _rel(y.double().numpy(), ref.double().numpy()) < 3e-2


def test_method_is_a_moe_method_that_folds_the_scale() -> None:
    assert GGMLMoEMethod.fuses_routed_scale_and_shared_add is True
    assert "fuses_routed_scale_and_shared_add" in vars(GGMLMoEMethod)


@pytest.mark.parametrize("in_topk", [False, True])
def test_combine_folds_scale_into_shared_add(in_topk: bool) -> None:
    bank, _, _ = make_bank(Q.Q4_0, Q.Q4_0, 2, 64, 32, seed=2)
    weights, ids = routing(2, 1, 2, seed=2)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    experts = types.SimpleNamespace(
        quant_method=GGMLMoEMethod(), should_fuse_routed_scaling_factor_in_topk=in_topk
    )
    routed = experts.quant_method.apply(
        bank.to(DEVICE), x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)
    )
    shared = torch.randn_like(routed)
    s = 2.5
    expect = shared + (1.0 if in_topk else s) * routed
    out = maybe_fuse_routed_scale_and_shared_add(experts, routed.clone(), shared.clone(), s)
    torch.testing.assert_close(out, expect)
    alone = maybe_fuse_routed_scale_and_shared_add(experts, routed.clone(), None, s)
    torch.testing.assert_close(alone, (1.0 if in_topk else s) * routed)


def _run(code: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, env=env, timeout=120)


def test_combine_never_imports_sgl_cuda_and_method_import_is_lazy() -> None:
    # one interpreter for both checks (each costs a torch import)
    _run(
        """
        import sys, torch
        from sgl_core import maybe_fuse_routed_scale_and_shared_add

        class Method:
            fuses_routed_scale_and_shared_add = True

        class Experts:
            quant_method = Method()

        routed, shared = torch.ones(2, 4), torch.zeros(2, 4)
        out = maybe_fuse_routed_scale_and_shared_add(Experts(), routed, shared, 3.0)
        assert torch.equal(out, torch.full((2, 4), 3.0)), out
        leaked = [m for m in sys.modules if m.split(".")[0] in ("sgl_cuda", "triton", "gguf")]
        assert not leaked, ("combine imported", leaked)

        # importing the GGML method and loader pulls neither Triton nor gguf
        from sgl_cuda.quantization import GGMLMoEMethod, load_ggml_expert_bank
        leaked = [m for m in sys.modules if m.split(".")[0] in ("triton", "gguf")]
        assert not leaked, ("sgl_cuda.quantization imported", leaked)
        """
    )


def test_bank_validation() -> None:
    bank, _, _ = make_bank(Q.Q4_K, Q.Q6_K, 2, 256, 256)
    assert (bank.num_experts, bank.hidden_size, bank.intermediate_size) == (2, 256, 256)
    assert isinstance(GGMLExpertBank(bank.gate_up, 12, bank.down, 14).gate_up_type, GGMLQuantType)  # type: ignore[arg-type]
    with pytest.raises(QuantTypeError, match="gate_up_type=1 "):
        GGMLExpertBank(bank.gate_up, 1, bank.down, Q.Q6_K)  # type: ignore[arg-type]
    with pytest.raises(ShapeMismatchError, match="down must be"):
        GGMLExpertBank(bank.gate_up, Q.Q4_K, bank.down, Q.Q4_K)  # 210-byte rows read as Q4_K
    with pytest.raises(ShapeMismatchError, match="down must be"):
        GGMLExpertBank(bank.gate_up, Q.Q4_K, bank.down[:, :128], Q.Q6_K)
    with pytest.raises(ShapeMismatchError, match="whole Q8_0 blocks"):
        GGMLExpertBank(bank.gate_up, Q.Q8_0, bank.down, Q.Q6_K)
    with pytest.raises(ShapeMismatchError, match="uint8"):
        GGMLExpertBank(bank.gate_up.float(), Q.Q4_K, bank.down, Q.Q6_K)


def test_apply_argument_errors() -> None:
    bank, _, _ = make_bank(Q.Q4_0, Q.Q4_0, 2, 64, 32)
    weights, ids = routing(2, 1, 2)
    method = GGMLMoEMethod()
    with pytest.raises(ShapeMismatchError, match="hidden=64"):
        method.apply(bank, torch.zeros(2, 32), weights, ids)
    with pytest.raises(IndexShapeError):
        method.apply(bank, torch.zeros(2, 64), weights[:, :0], ids)
    with pytest.raises(TypeError, match="GGMLExpertBank"):
        method.apply(object(), torch.zeros(2, 64), weights, ids)  # type: ignore[arg-type]
    empty = method.apply(bank, torch.zeros(0, 64), weights[:0], ids[:0])
    assert empty.shape == (0, 64)
