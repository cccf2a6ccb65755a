"""Expert banks from a real ``.gguf`` file written with ``gguf.GGUFWriter``.

Shapes are chosen with H != I != E so a transposed or reversed dim cannot go
unnoticed. The end-to-end tolerance is the Q8_1-emulated one of
``test_ggml_method`` (float32 rounding only, see there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _ggml_oracle import dequantize, float_reference, random_blocks, routing

from sgl_core.errors import PoolMismatchError, QuantTypeError, ShapeMismatchError
from sgl_cuda.quantization import GGMLMoEMethod, GGMLQuantType, load_ggml_expert_bank

gguf: Any = pytest.importorskip("gguf")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, I, E = 256, 64, 3  # noqa: E741  hidden, intermediate, experts


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, int]]) -> None:
    writer = gguf.GGUFWriter(str(path), "test-moe")
    for name, (data, qtype) in tensors.items():
        if data.dtype == np.uint8:
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType(qtype))
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _layer(layer: int, gate_t: int, down_t: int, seed: int) -> dict[str, tuple[np.ndarray, int]]:
    """numpy (torch-order) byte arrays: gate/up (E, I, bytes(H)), down (E, H, bytes(I))."""
    rng = np.random.default_rng(seed)
    return {
        f"blk.{layer}.ffn_gate_exps.weight": (
            random_blocks(gate_t, E * I, H, rng).reshape(E, I, -1),
            gate_t,
        ),
        f"blk.{layer}.ffn_up_exps.weight": (
            random_blocks(gate_t, E * I, H, rng).reshape(E, I, -1),
            gate_t,
        ),
        f"blk.{layer}.ffn_down_exps.weight": (
            random_blocks(down_t, E * H, I, rng).reshape(E, H, -1),
            down_t,
        ),
    }


@pytest.fixture(scope="module")
def model(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, tuple[np.ndarray, int]]]:
    tensors = {
        **_layer(0, int(GGMLQuantType.Q4_K), int(GGMLQuantType.Q8_0), seed=0),
        **_layer(1, int(GGMLQuantType.Q6_K), int(GGMLQuantType.Q5_0), seed=1),
        "blk.1.ffn_gate_inp.weight": (np.zeros((E, H), dtype=np.float32), 0),
    }
    path = tmp_path_factory.mktemp("gguf") / "tiny-moe.gguf"
    _write(path, tensors)
    return path, tensors


def test_file_stores_dims_in_ne_order(model: tuple[Path, Any]) -> None:
    path, _ = model
    by_name = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert [int(v) for v in by_name["blk.0.ffn_gate_exps.weight"].shape] == [H, I, E]
    assert [int(v) for v in by_name["blk.0.ffn_down_exps.weight"].shape] == [I, H, E]


@pytest.mark.parametrize("layer", [0, 1])
def test_loader_fuses_gate_and_up(model: tuple[Path, Any], layer: int) -> None:
    path, tensors = model
    bank = load_ggml_expert_bank(path, layer)
    gate, gate_t = tensors[f"blk.{layer}.ffn_gate_exps.weight"]
    up, _ = tensors[f"blk.{layer}.ffn_up_exps.weight"]
    down, down_t = tensors[f"blk.{layer}.ffn_down_exps.weight"]
    assert (bank.num_experts, bank.hidden_size, bank.intermediate_size) == (E, H, I)
    assert (int(bank.gate_up_type), int(bank.down_type)) == (gate_t, down_t)
    np.testing.assert_array_equal(bank.gate_up.numpy(), np.concatenate([gate, up], axis=1))
    np.testing.assert_array_equal(bank.down.numpy(), down)


@pytest.mark.parametrize("layer", [0, 1])
def test_end_to_end_from_file(model: tuple[Path, Any], layer: int) -> None:
    path, tensors = model
    reader = gguf.GGUFReader(str(path))  # an open reader works as well as a path
    bank = load_ggml_expert_bank(reader, layer, device=DEVICE)
    gate, gate_t = tensors[f"blk.{layer}.ffn_gate_exps.weight"]
    up, _ = tensors[f"blk.{layer}.ffn_up_exps.weight"]
    down, down_t = tensors[f"blk.{layer}.ffn_down_exps.weight"]
    wgu = np.concatenate([dequantize(gate, gate_t), dequantize(up, gate_t)], axis=1)  # (E, 2I, H)
    wd = dequantize(down, down_t)  # (E, H, I)
    weights, ids = routing(3, 2, E, seed=layer)
    x = torch.randn(3, H, generator=torch.Generator().manual_seed(layer))
    y = (
        GGMLMoEMethod()
        .apply(bank, x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE))
        .cpu()
        .double()
        .numpy()
    )
    w64, ids_np = weights.double().numpy(), ids.numpy()
    exact = float_reference(x.double().numpy(), wgu, wd, w64, ids_np, emulate=False)
    emulated = float_reference(x.numpy(), wgu, wd, w64, ids_np, emulate=True)
    assert np.linalg.norm(y - exact) / np.linalg.norm(exact) < 3e-2
    assert np.linalg.norm(y - emulated) / np.linalg.norm(emulated) < 2e-4


def test_missing_tensor(model: tuple[Path, Any]) -> None:
    path, _ = model
    with pytest.raises(PoolMismatchError, match=r"blk\.7\.ffn_gate_exps\.weight"):
        load_ggml_expert_bank(path, 7)


def test_missing_up_names_what_the_layer_has(tmp_path: Path) -> None:
    tensors = _layer(0, 12, 8, seed=3)
    del tensors["blk.0.ffn_up_exps.weight"]
    _write(tmp_path / "m.gguf", tensors)
    with pytest.raises(
        PoolMismatchError, match=r"lacks blk\.0\.ffn_up_exps\.weight.*ffn_down_exps"
    ):
        load_ggml_expert_bank(tmp_path / "m.gguf", 0)


def test_gate_up_type_mismatch(tmp_path: Path) -> None:
    tensors = _layer(0, 12, 8, seed=3)
    rng = np.random.default_rng(0)
    tensors["blk.0.ffn_up_exps.weight"] = (random_blocks(14, E * I, H, rng).reshape(E, I, -1), 14)
    _write(tmp_path / "m.gguf", tensors)
    with pytest.raises(PoolMismatchError, match=r"Q4_K but .* is Q6_K"):
        load_ggml_expert_bank(tmp_path / "m.gguf", 0)


def test_down_shape_mismatch(tmp_path: Path) -> None:
    tensors = _layer(0, 12, 8, seed=3)
    down, _ = tensors["blk.0.ffn_down_exps.weight"]
    tensors["blk.0.ffn_down_exps.weight"] = (np.ascontiguousarray(down[:, : H // 2]), 8)  # H/2 rows
    _write(tmp_path / "m.gguf", tensors)
    with pytest.raises(ShapeMismatchError, match=r"must be \(I, H, E\)"):
        load_ggml_expert_bank(tmp_path / "m.gguf", 0)


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    tensors = _layer(0, 12, 8, seed=3)
    tensors["blk.0.ffn_down_exps.weight"] = (np.zeros((E, H, I), dtype=np.float16), 1)
    _write(tmp_path / "m.gguf", tensors)
    with pytest.raises(QuantTypeError, match=r"has type F16.*Q4_K=12"):
        load_ggml_expert_bank(tmp_path / "m.gguf", 0)
