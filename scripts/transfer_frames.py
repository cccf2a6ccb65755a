"""Frames of our own code on the stack at each copy of a backup and a per-layer load.

Run with a tree's sources on PYTHONPATH (works on trees before and after the
mover seam), e.g.::

    PYTHONPATH=packages/core/src:packages/cuda/src:packages/ascend/src \\
        python scripts/transfer_frames.py

For each case it prints the deepest chain of sgl_* frames from the public
method to a copy primitive (a torch copy/gather op or the ``memmove`` loop),
and the peak Python allocation of five repeated loads of the same layer.
``--every-pair``: the load chain of every backend x kind (MLA, DSA, MHA) x
(layout, io) this tree builds, as a markdown table.
"""

from __future__ import annotations

import functools
import sys
import tracemalloc
import types
from collections.abc import Callable

import torch

OURS = ("/sgl_core/", "/sgl_cuda/", "/sgl_ascend/")
COPIES = {"copy_", "_foreach_copy_", "index_copy_", "index_select"}
# our copy loops that are themselves the primitive (by-address blocks, numpy run copies)
PRIMITIVES = {"_memmove_all", "copy_slices", "take_rows"}


def our_frames(frame: types.FrameType | None) -> list[str]:
    out: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if any(o in name for o in OURS) and "/testing/" not in name:
            out.append(f"{name.split('/src/')[-1]}:{frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


def deepest_copy(call: Callable[[], None]) -> list[str]:
    best: list[str] = []

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        nonlocal best
        copy = (event == "c_call" and getattr(arg, "__name__", "") in COPIES) or (
            event == "call" and frame.f_code.co_name in PRIMITIVES
        )
        if copy:
            stack = our_frames(frame)
            if len(stack) > len(best):
                best = stack

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return best


def run_case(name: str, layout: str, ps: int) -> None:
    import sgl_core

    backend = sgl_core.get_backend(name)
    dev = backend.create_device_pool(
        size=32 * ps, page_size=ps, dtype=torch.bfloat16, kv_lora_rank=512,
        qk_rope_head_dim=64, layer_num=4,
    )  # fmt: skip
    host = backend.create_host_pool(dev, layout=layout)
    io = backend.default_io(layout)
    gen = torch.Generator().manual_seed(0)
    d_pages = torch.randperm(32, generator=gen)[:16]
    h_pages = torch.randperm(64, generator=gen)[:16]
    d_idx = (d_pages[:, None] * ps + torch.arange(ps)).flatten()
    h_idx = (h_pages[:, None] * ps + torch.arange(ps)).flatten()
    backup = deepest_copy(lambda: host.backup_from_device_all_layer(dev, h_idx, d_idx, io))
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, io)
    load = deepest_copy(lambda: host.load_to_device_per_layer(dev, h_idx, d_idx, 1, io))
    for _ in range(3):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, io)
    tracemalloc.start()
    for _ in range(5):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, io)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"== {name} {layout}/{io.value} page {ps}")
    print(f"  backup {len(backup)} frames: {' > '.join(backup)}")
    print(f"  load   {len(load)} frames: {' > '.join(load)}")
    print(f"  repeated load: Python peak {peak} B over 5 calls")


def _pool(backend: object, kind: str, ps: int) -> object:
    common = {"size": 32 * ps, "page_size": ps, "dtype": torch.bfloat16, "layer_num": 4}
    if kind == "mha":
        return backend.create_mha_device_pool(head_num=2, head_dim=64, **common)  # type: ignore[attr-defined]
    extra = {"index_head_dim": 128, "indexer_layer_ids": (1,), "with_index_k_scale": True}
    return backend.create_device_pool(  # type: ignore[attr-defined]
        kv_lora_rank=512, qk_rope_head_dim=64, **common, **(extra if kind == "dsa" else {})
    )


def every_pair() -> None:
    """The deepest load chain of every backend x kind x (layout, io), pages of 16 tokens,
    on a repeated per-layer load (the memo path), as one markdown table."""
    import sgl_core

    print("| backend | kind | layout/io | load frames | chain |")
    print("|---|---|---|---|---|")
    ps = 16
    for name in sgl_core.available_backends():
        backend = sgl_core.get_backend(name)
        for kind in ("mla", "dsa", "mha"):
            pairs = backend.supported_mha_pairs if kind == "mha" else backend.supported_pairs
            for layout, ios in pairs.items():
                for io in sorted(ios, key=lambda i: i.value):
                    try:
                        dev = _pool(backend, kind, ps)
                        host = backend.create_host_pool(dev, layout=layout)
                    except Exception as exc:
                        pair = f"{layout.value}/{io.value}"
                        print(f"| {name} | {kind} | {pair} | - | {type(exc).__name__} |")
                        continue
                    idx = (torch.tensor([3, 0, 5, 1])[:, None] * ps + torch.arange(ps)).flatten()
                    h_idx = idx + ps
                    host.backup_from_device_all_layer(dev, h_idx, idx, io)
                    host.load_to_device_per_layer(dev, h_idx, idx, 0, io)
                    host.load_to_device_per_layer(dev, h_idx, idx, 1, io)
                    chain = deepest_copy(
                        functools.partial(host.load_to_device_per_layer, dev, h_idx, idx, 1, io)
                    )
                    short = " > ".join(c.rsplit(":", 1)[1] for c in chain)
                    print(
                        f"| {name} | {kind} | {layout.value}/{io.value} | {len(chain)} | {short} |"
                    )


def main() -> None:
    if sys.argv[1:] == ["--every-pair"]:
        every_pair()
        return
    for case in (
        ("torch", "layer_first", 64),
        ("torch", "layer_first", 1),
        ("torch", "page_first", 1),
        ("torch", "page_first_direct", 64),
        ("ascend", "page_first_kv_split", 64),
        ("ascend", "page_first_kv_split", 4),
    ):
        run_case(*case)


if __name__ == "__main__":
    main()
