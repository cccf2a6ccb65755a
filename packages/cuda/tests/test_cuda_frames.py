"""How deep a per-layer load of every cuda pair reaches the copy (issue #23's frame bound).

A repeated per-layer load (the memo path: same pool, same index tensors) is
measured from the public method to the copy primitive (a torch copy op, the
``memmove`` loop, or the Triton launcher), counting frames of ``sgl_core``
and ``sgl_cuda``. Every ``kernel`` pair, DSA included, is at most 3 frames
and binds its launches once per validated transfer. A ``direct`` pair is too:
``CudaDirectMover.load`` runs the core mover's bound copy steps itself (then
records the pool's stream fence), so it adds no frame to the core's.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import sgl_core
import sgl_cuda
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_cuda._movers import KernelMover

OURS = (str(Path(sgl_core.__file__).parent), str(Path(sgl_cuda.__file__).parent))
TESTING = str(Path(sgl_core.__file__).parent / "testing")
COPIES = {"copy_", "_foreach_copy_", "index_copy_", "index_select"}
LAUNCHERS = {"_memmove_all", "copy_slices", "take_rows", "launch_copy_kv_rows", "launch_copy_rows"}
PS = 4


def frames_at_copies(call: Callable[[], None]) -> list[int]:
    """Our frames on the stack at each copy primitive (torch op, memmove, kernel launcher)."""
    depths: list[int] = []

    def ours(frame: types.FrameType | None) -> int:
        n = 0
        while frame is not None:
            name = frame.f_code.co_filename
            n += name.startswith(OURS) and not name.startswith(TESTING)
            frame = frame.f_back
        return n

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if (event == "c_call" and getattr(arg, "__name__", "") in COPIES) or (
            event == "call" and frame.f_code.co_name in LAUNCHERS
        ):
            depths.append(ours(frame))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return depths


def device_pool(backend: Any, kind: str) -> Any:
    common: dict[str, Any] = {"size": 8 * PS, "page_size": PS, "dtype": torch.bfloat16}
    common["layer_num"] = 3
    if kind == "mha":
        return backend.create_mha_device_pool(head_num=2, head_dim=8, **common)
    dsa = {"index_head_dim": 16, "indexer_layer_ids": (1,), "with_index_k_scale": True}
    return backend.create_device_pool(
        kv_lora_rank=16, qk_rope_head_dim=8, **common, **(dsa if kind == "dsa" else {})
    )


def pairs() -> list[tuple[str, str, str]]:
    backend = sgl_cuda.backend
    out = []
    for kind in ("mla", "dsa", "mha"):
        table = backend.supported_mha_pairs if kind == "mha" else backend.supported_pairs
        for layout, ios in table.items():
            out += [(kind, layout.value, io.value) for io in sorted(ios, key=lambda i: i.value)]
    return out


def load_depth(backend: Any, kind: str, layout: str, io: str) -> tuple[int, Any, Any]:
    src = device_pool(backend, kind)
    fill_device_random(src, 2)
    host = backend.create_host_pool(src, layout=layout, io_backend=io)
    h_idx, d_idx = page_indices([5, 0, 2], PS), page_indices([1, 3, 2], PS)
    host.backup_from_device_all_layer(src, h_idx, d_idx, io)
    dst = device_pool(backend, kind)
    host.load_to_device_per_layer(dst, h_idx, d_idx, 0, io)
    depths = frames_at_copies(lambda: host.load_to_device_per_layer(dst, h_idx, d_idx, 1, io))
    assert depths, "no copy seen"
    for layer in (0, 1):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(src, layer, d_idx))
    return max(depths), host, dst


@pytest.mark.parametrize(("kind", "layout", "io"), pairs())
def test_per_layer_load_depth_of_every_cuda_pair(
    kind: str, layout: str, io: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SGL_CUDA_DIRECT_COPY", raising=False)
    depth, _, _ = load_depth(sgl_cuda.backend, kind, layout, io)
    assert depth <= 3, (kind, layout, io, depth)


def test_the_pairs_cover_every_kernel_layout_and_dsa() -> None:
    found = set(pairs())
    assert ("dsa", "page_first", "kernel") in found and ("mha", "page_head", "kernel") in found
    assert len(found) == 13


@pytest.mark.parametrize("kind", ["mla", "dsa", "mha"])
def test_repeated_kernel_loads_reuse_their_bound_launches(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layer's launches are bound (and checked) on its first load of a transfer only."""
    bound: list[int] = []
    real = KernelMover._bind_load

    def counting(self: KernelMover, transfer: Any, layer_id: int, *idx: torch.Tensor) -> Any:
        bound.append(layer_id)
        return real(self, transfer, layer_id, *idx)

    monkeypatch.setattr(KernelMover, "_bind_load", counting)
    backend = sgl_cuda.backend
    src = device_pool(backend, kind)
    fill_device_random(src, 4)
    host = backend.create_host_pool(src, layout="layer_first", io_backend="kernel")
    h_idx, d_idx = page_indices([3, 1], PS), page_indices([0, 2], PS)
    host.backup_from_device_all_layer(src, h_idx, d_idx, "kernel")
    dst = device_pool(backend, kind)
    for layer in (0, 1, 1, 2, 1):
        host.load_to_device_per_layer(dst, h_idx, d_idx, layer, "kernel")
    assert bound == [0, 1, 2]
    fresh = page_indices([3, 1], PS)  # new index tensors: validated again, bound again
    host.load_to_device_per_layer(dst, fresh, d_idx, 1, "kernel")
    assert bound == [0, 1, 2, 1]
    for layer in range(3):
        assert torch.equal(device_rows(dst, layer, d_idx), device_rows(src, layer, d_idx))
    if kind == "dsa":  # model layer 1 keeps indexer slot 0
        assert torch.equal(dst.index_k_buffer[0][d_idx], src.index_k_buffer[0][d_idx])
        # bytes, not floats: random bits in a float32 scale can be a NaN (NaN != NaN)
        assert torch.equal(dst.index_k_scale_buffer[0][d_idx].view(torch.uint8),
                           src.index_k_scale_buffer[0][d_idx].view(torch.uint8))  # fmt: skip


def test_dsa_kernel_loads_move_indexer_rows_only_on_their_layers() -> None:
    backend = sgl_cuda.backend
    src = device_pool(backend, "dsa")
    fill_device_random(src, 5)
    for slot in (src.index_k_buffer, src.index_k_scale_buffer):
        for t in slot:
            t.view(torch.uint8).copy_(torch.randint(0, 255, t.view(torch.uint8).shape))
    for layout in ("layer_first", "page_first"):
        host = backend.create_host_pool(src, layout=layout, io_backend="kernel")
        h_idx, d_idx = page_indices([4, 2], PS), page_indices([1, 0], PS)
        host.backup_from_device_all_layer(src, h_idx, d_idx, "kernel")
        dst = device_pool(backend, "dsa")
        host.load_to_device_per_layer(dst, h_idx, d_idx, 0, "kernel")  # no indexer row
        assert not dst.index_k_buffer[0].view(torch.uint8).any()
        host.load_to_device_per_layer(dst, h_idx, d_idx, 1, "kernel")
        assert torch.equal(dst.index_k_buffer[0][d_idx].view(torch.uint8),
                           src.index_k_buffer[0][d_idx].view(torch.uint8))  # fmt: skip
        # bytes, not floats: random bits in a float32 scale can be a NaN (NaN != NaN)
        assert torch.equal(dst.index_k_scale_buffer[0][d_idx].view(torch.uint8),
                           src.index_k_scale_buffer[0][d_idx].view(torch.uint8))  # fmt: skip


def test_probe_sees_deep_copies() -> None:
    """The frame counter is not vacuous: a copy five of our frames deep counts five."""
    mover = sys.modules[KernelMover.__module__]
    assert mover.__file__ is not None and mover.__file__.startswith(OURS)
    code = "def f(n, t):\n    return f(n - 1, t) if n > 1 else t.copy_(t)\n"
    scope: dict[str, object] = {}
    exec(compile(code, mover.__file__, "exec"), scope)
    depths = frames_at_copies(lambda: scope["f"](5, torch.zeros(2)))  # type: ignore[operator]
    assert depths == [5]
