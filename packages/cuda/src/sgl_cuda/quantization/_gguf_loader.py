"""Load one layer's expert banks from a ``.gguf`` file (needs ``sgl-cuda[gguf]``).

GGUF lists tensor dims in ggml's ``ne`` order, innermost first, i.e. reversed
from torch/numpy: ``blk.N.ffn_gate_exps.weight`` has ``ne = (H, I, E)`` and is
stored as numpy ``(E, I, row_bytes(H))``; ``ffn_down_exps`` has
``ne = (I, H, E)``, stored ``(E, H, row_bytes(I))``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from sgl_core.errors import PoolMismatchError, QuantTypeError, ShapeMismatchError
from sgl_cuda.quantization._method import GGMLExpertBank
from sgl_cuda.quantization._types import block_format, resolve_quant_type

__all__ = ["load_ggml_expert_bank"]


def _to_torch(tensor: Any, name: str, device: torch.device | str | None) -> torch.Tensor:
    data = np.asarray(tensor.data)
    if data.dtype != np.uint8 or data.ndim != 3:
        raise ShapeMismatchError(
            f"{name}: expected 3-D uint8 block data, got {data.dtype} {data.shape}"
        )
    out = torch.from_numpy(np.array(data, copy=True))  # detach from the read-only memmap
    return out if device is None else out.to(device)


def load_ggml_expert_bank(
    path_or_reader: str | os.PathLike[str] | Any,
    layer_id: int,
    *,
    device: torch.device | str | None = None,
) -> GGMLExpertBank:
    """The :class:`GGMLExpertBank` of layer ``layer_id`` of a GGUF file.

    ``path_or_reader`` is a path or an open ``gguf.GGUFReader``. Reads
    ``blk.{layer_id}.ffn_{gate,up,down}_exps.weight`` and concatenates gate and
    up rows into ``gate_up``. A missing tensor, gate/up of different types or
    shapes, or a down bank that does not match raises a ``ValueError`` subclass
    from ``sgl_core.errors``; an unsupported quant type raises ``QuantTypeError``.
    """
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "loading GGUF files needs the 'gguf' package: pip install './packages/cuda[gguf]'"
        ) from exc
    if isinstance(path_or_reader, (str, os.PathLike)):
        reader = gguf.GGUFReader(os.fspath(path_or_reader))
        source = os.fspath(path_or_reader)
    else:
        reader = path_or_reader
        source = "the GGUF reader"
    by_name = {t.name: t for t in reader.tensors}
    parts = ("gate", "up", "down")
    names = {part: f"blk.{layer_id}.ffn_{part}_exps.weight" for part in parts}
    missing = [n for n in names.values() if n not in by_name]
    if missing:
        have = sorted(n for n in by_name if n.startswith(f"blk.{layer_id}.ffn_"))
        raise PoolMismatchError(
            f"{source} lacks {', '.join(missing)} for layer {layer_id} "
            f"(its layer {layer_id} FFN tensors: {', '.join(have) or 'none'})"
        )
    gate, up, down = (by_name[names[p]] for p in parts)

    types = {}
    for part, t in zip(parts, (gate, up, down), strict=True):
        try:
            types[part] = resolve_quant_type(int(t.tensor_type), names[part])
        except QuantTypeError as exc:
            raise QuantTypeError(
                f"{names[part]} in {source} has type {t.tensor_type.name}: {exc}"
            ) from None
    if types["gate"] != types["up"]:
        raise PoolMismatchError(
            f"{names['gate']} is {types['gate'].name} but {names['up']} is {types['up'].name}; "
            "gate and up must share a quant type to be fused"
        )
    gate_ne, up_ne, down_ne = (tuple(int(v) for v in t.shape) for t in (gate, up, down))
    if len(gate_ne) != 3 or gate_ne != up_ne:
        raise ShapeMismatchError(
            f"{names['gate']} ne={gate_ne} and {names['up']} ne={up_ne} must be equal (H, I, E)"
        )
    hidden, inter, experts = gate_ne
    if down_ne != (inter, hidden, experts):
        raise ShapeMismatchError(
            f"{names['down']} ne={down_ne} must be (I, H, E) = {(inter, hidden, experts)} "
            f"to match {names['gate']} ne={gate_ne}"
        )
    for part, k in (("gate", hidden), ("down", inter)):
        fmt = block_format(types[part])
        if k % fmt.block_size:
            raise ShapeMismatchError(
                f"{names[part]} rows of {k} are not whole {types[part].name} blocks"
            )

    gate_t, up_t, down_t = (_to_torch(by_name[names[p]], names[p], device) for p in parts)
    return GGMLExpertBank(
        gate_up=torch.cat([gate_t, up_t], dim=1),
        gate_up_type=types["gate"],
        down=down_t,
        down_type=types["down"],
    )
