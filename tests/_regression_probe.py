"""The upstream bug class, replayed in an isolated env (``python -I _regression_probe.py MODE``).

Upstream (sglang PR #36640, reverted in #36747), shared code decided device
behaviour by importing every device's classes: the MoE combine imported the
GGML method (and with it a CUDA-only kernel), and the host MLA backup read the
CUDA pool's ``data_ptrs``. A fix for one device broke the other. Here each
device's real objects go through the *shared* sgl_core paths while a
``sys.meta_path`` finder makes every module of the other device stack raise
``ImportError`` (as on a machine where it cannot load).

MODE ``cuda``: GGML MoE method (Triton interpreter on CPU) through
``maybe_fuse_routed_scale_and_shared_add``; CUDA pool backup/load through
``MLAHostPool``. MODE ``ascend``: Ascend pools (``kernel_ascend``: all-layer
backup, per-layer load) and the Ascend MoE method through the combine.
MODE ``core``: the torch backend and method with both device stacks blocked.
Prints ``REGRESSION-OK <mode>`` on success; any failure is a traceback.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType, SimpleNamespace

BLOCKED: dict[str, tuple[str, ...]] = {
    "cuda": ("sgl_ascend", "torch_npu", "sgl_kernel_npu"),
    "ascend": ("sgl_cuda", "triton", "sgl_kernel"),
    "core": ("sgl_ascend", "torch_npu", "sgl_kernel_npu", "sgl_cuda", "triton", "sgl_kernel"),
}


class RaiseOnImport(importlib.abc.MetaPathFinder):
    """Every import of a blocked top-level package raises, as on the other device."""

    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = frozenset(roots)
        self.attempts: list[str] = []

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.roots:
            self.attempts.append(fullname)
            raise ImportError(f"{fullname} is blocked: it belongs to the other device stack")
        return None


def install_blocker(mode: str) -> RaiseOnImport:
    roots = BLOCKED[mode]
    already = sorted({m.partition(".")[0] for m in sys.modules} & set(roots))
    assert not already, f"blocked modules already loaded: {already}"
    blocker = RaiseOnImport(roots)
    sys.meta_path.insert(0, blocker)
    for root in roots:  # the blocker itself works
        try:
            __import__(root)
        except ImportError:
            pass
        else:
            raise AssertionError(f"import {root} did not raise")
    blocker.attempts.clear()
    return blocker


def check_combine(method: object, routed: object, scale: float) -> None:
    """The shared combine, fed a device package's method object."""
    import torch

    from sgl_core import folds_routed_scale, maybe_fuse_routed_scale_and_shared_add

    assert isinstance(routed, torch.Tensor)
    experts = SimpleNamespace(quant_method=method)
    shared = torch.randn_like(routed)
    folds = folds_routed_scale(experts)
    assert folds is type(method).fuses_routed_scale_and_shared_add  # type: ignore[attr-defined]
    expected = shared + scale * routed if folds else routed + shared
    out = maybe_fuse_routed_scale_and_shared_add(experts, routed.clone(), shared.clone(), scale)
    torch.testing.assert_close(out, expected)
    alone = maybe_fuse_routed_scale_and_shared_add(experts, routed.clone(), None, scale)
    torch.testing.assert_close(alone, scale * routed if folds else routed)


def roundtrip(backend_name: str, layout: str, io_backend: str, page_size: int = 4) -> None:
    """Backup all layers of two pages, then load them elsewhere one layer at a time."""
    import torch

    import sgl_core
    from sgl_core import MLADevicePool, MLAHostPool

    backend = sgl_core.get_backend(backend_name)
    assert backend.name == backend_name
    layers = 3
    dev: MLADevicePool = backend.create_device_pool(
        size=8 * page_size,
        page_size=page_size,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=layers,
        device="cpu",
    )
    host: MLAHostPool = backend.create_host_pool(dev, layout=layout, io_backend=io_backend)
    src = torch.arange(page_size, 3 * page_size, dtype=torch.int64)
    dst = torch.arange(5 * page_size, 7 * page_size, dtype=torch.int64)
    rows = []
    for layer in range(layers):
        nope = torch.randn(len(src), 1, 16).to(torch.bfloat16)
        rope = torch.randn(len(src), 1, 8).to(torch.bfloat16)
        dev.set_mla_kv_buffer(layer, src, nope, rope)
        rows.append((nope, rope))
    host_idx = host.alloc(len(src))
    assert host_idx is not None
    host.backup_from_device_all_layer(dev, host_idx, src, io_backend)
    for layer in range(layers):
        host.load_to_device_per_layer(dev, host_idx, dst, layer, io_backend)
        got = dev.get_mla_kv_buffer(layer, dst)
        assert torch.equal(got[0], rows[layer][0])
        assert torch.equal(got[1], rows[layer][1])
        for later in range(layer + 1, layers):  # per layer: later layers not loaded yet
            assert not torch.equal(dev.get_mla_kv_buffer(later, dst)[0], rows[later][0])
    assert host.free(host_idx) == len(src)


def q8_0_bank(experts: int, rows: int, cols: int, gen: object) -> tuple[object, object]:
    """Random GGUF Q8_0 blocks ``(E, rows, cols/32*34)`` and their float dequantization."""
    import numpy as np
    import torch

    assert isinstance(gen, torch.Generator)
    blocks = cols // 32
    d = (torch.rand(experts, rows, blocks, 1, generator=gen) * 0.02 + 0.005).to(torch.float16)
    q = torch.randint(-127, 128, (experts, rows, blocks, 32), generator=gen, dtype=torch.int8)
    raw = np.concatenate([d.numpy().view(np.uint8), q.numpy().view(np.uint8)], axis=-1).reshape(
        experts, rows, blocks * 34
    )
    deq = (d.float() * q.float()).reshape(experts, rows, cols)
    return torch.from_numpy(np.ascontiguousarray(raw)), deq


def run_cuda() -> None:
    import torch

    import sgl_core
    import sgl_cuda

    assert os.environ.get("TRITON_INTERPRET") == "1"
    try:
        from sgl_cuda.quantization import GGMLExpertBank, GGMLMoEMethod, GGMLQuantType
    except ImportError as exc:  # pragma: no cover - only if sgl_cuda drops GGML
        raise AssertionError(f"sgl_cuda.quantization.GGMLMoEMethod is gone: {exc}") from exc

    gen = torch.Generator().manual_seed(0)
    e, hidden, inter, tokens, top_k = 3, 64, 32, 4, 2
    gu_raw, gu = q8_0_bank(e, 2 * inter, hidden, gen)
    down_raw, down = q8_0_bank(e, hidden, inter, gen)
    bank = GGMLExpertBank(gu_raw, GGMLQuantType.Q8_0, down_raw, GGMLQuantType.Q8_0)  # type: ignore[arg-type]
    x = torch.randn(tokens, hidden, generator=gen)
    ids = torch.randint(0, e, (tokens, top_k), generator=gen)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=-1)
    method = GGMLMoEMethod()
    routed = method.apply(bank, x, weights, ids)
    # float reference on the dequantized weights (activations quantized to Q8_1 twice)
    assert isinstance(gu, torch.Tensor)
    assert isinstance(down, torch.Tensor)
    ref = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for k in range(top_k):
            g = gu[int(ids[t, k])] @ x[t]
            act = torch.nn.functional.silu(g[:inter]) * g[inter:]
            ref[t] += weights[t, k] * (down[int(ids[t, k])] @ act)
    rel = float((routed.float() - ref).norm() / ref.norm())
    assert rel < 0.03, f"GGML routed output off by {rel:.3%} from the float reference"
    check_combine(method, routed, 2.5)

    roundtrip("cuda", "layer_first", "kernel")
    roundtrip("cuda", "page_first", "kernel")
    dev = sgl_core.get_backend("cuda").create_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=8, layer_num=2
    )
    assert isinstance(dev, sgl_cuda.CudaMLADevicePool)
    assert hasattr(dev, "data_ptrs")  # the CUDA-only table that upstream's shared code read


def run_ascend() -> None:
    import torch

    import sgl_ascend
    import sgl_core
    from sgl_core import MoEWeights, TorchMoEMethod

    roundtrip("ascend", "page_first_kv_split", "kernel_ascend")
    dev = sgl_core.get_backend("ascend").create_device_pool(
        size=8, page_size=4, dtype=torch.bfloat16, kv_lora_rank=8, qk_rope_head_dim=8, layer_num=2
    )
    assert isinstance(dev, sgl_ascend.AscendMLADevicePool)
    assert not hasattr(dev, "data_ptrs")  # what crashed upstream's shared backup on NPU

    gen = torch.Generator().manual_seed(0)
    e, hidden, inter, tokens, top_k = 4, 32, 16, 5, 2
    layer = MoEWeights(
        torch.randn(e, 2 * inter, hidden, generator=gen) / 4,
        torch.randn(e, hidden, inter, generator=gen) / 4,
    )
    x = torch.randn(tokens, hidden, generator=gen)
    ids = torch.randint(0, e, (tokens, top_k), generator=gen)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=-1)
    method = sgl_ascend.AscendMoEMethod()
    routed = method.apply(layer, x, weights, ids)
    torch.testing.assert_close(routed, TorchMoEMethod().apply(layer, x, weights, ids))
    check_combine(method, routed, 2.5)


def run_core() -> None:
    import torch

    from sgl_core import MoEWeights, TorchMoEMethod

    roundtrip("torch", "page_first_direct", "direct")
    gen = torch.Generator().manual_seed(0)
    layer = MoEWeights(torch.randn(2, 16, 8, generator=gen), torch.randn(2, 8, 8, generator=gen))
    x = torch.randn(3, 8, generator=gen)
    ids = torch.randint(0, 2, (3, 2), generator=gen)
    weights = torch.softmax(torch.randn(3, 2, generator=gen), dim=-1)
    method = TorchMoEMethod()
    check_combine(method, method.apply(layer, x, weights, ids), 2.5)


def main(mode: str) -> None:
    blocker = install_blocker(mode)
    {"cuda": run_cuda, "ascend": run_ascend, "core": run_core}[mode]()
    loaded = sorted({m.partition(".")[0] for m in sys.modules} & blocker.roots)
    assert not loaded, f"blocked modules got loaded: {loaded}"
    # Reported, not failed: an attempt that was caught and survived is still a smell.
    print(f"blocked import attempts: {blocker.attempts}")
    print(f"REGRESSION-OK {mode}")


if __name__ == "__main__":
    main(sys.argv[1])
