"""The ``kernel`` MHA pool moves rows as int64 words: what it cannot move it refuses up front.

A pool whose K or V rows (``page_head``: a head's slice of a row) are not
whole 8-byte words is refused at construction, as the MLA pool is; a device
layer the kernels cannot address is refused before the first byte moves, so
a refused transfer never leaves K moved and V not.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sgl_core.errors import PoolMismatchError, ShapeMismatchError, UnsupportedLayoutError
from sgl_cuda import _movers, backend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PS, LAYERS = 4, 2


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(torch.uint8).clone()


def device_pool(head_num: int, head_dim: int, v_head_dim: int) -> Any:
    pool: Any = backend.create_mha_device_pool(
        size=4 * PS, page_size=PS, dtype=torch.bfloat16, head_num=head_num, head_dim=head_dim,
        layer_num=LAYERS, device=DEVICE, v_head_dim=v_head_dim,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(head_num * 100 + head_dim * 10 + v_head_dim)
    for layers in (pool.k_buffer, pool.v_buffer):
        for t in layers:
            bits = torch.randint(0, 256, (t.numel() * t.element_size(),), generator=gen)
            t.view(torch.uint8).view(-1).copy_(bits.to(torch.uint8).to(t.device))
    return pool


@pytest.mark.parametrize(
    ("layout", "heads", "k_dim", "v_dim"),
    [
        ("layer_first", 1, 2, 2),  # K and V rows of 4 bytes
        ("page_first", 1, 2, 2),
        ("page_head", 1, 2, 2),
        ("layer_first", 1, 4, 2),  # K rows of 8 bytes, V rows of 4
        ("page_first", 1, 4, 2),
        ("page_head", 1, 4, 2),
        ("page_head", 2, 8, 2),  # V rows of 8 bytes, but 4 per head
    ],
)
def test_rows_of_no_whole_words_refused_at_construction(
    layout: str, heads: int, k_dim: int, v_dim: int
) -> None:
    dev = device_pool(heads, k_dim, v_dim)
    with pytest.raises(UnsupportedLayoutError, match="8-byte words"):
        backend.create_host_pool(dev, layout=layout)


def test_whole_word_rows_and_direct_layout_still_built() -> None:
    """The refusal is exactly the rows no kernel can move: these pools are built."""
    backend.create_host_pool(device_pool(2, 8, 2), layout="layer_first")  # V rows of 8 bytes
    backend.create_host_pool(device_pool(2, 8, 2), layout="page_first")
    backend.create_host_pool(device_pool(1, 2, 2), layout="page_first_direct")  # direct io


def _misaligned_v_layer(dev: Any) -> torch.Tensor:
    """Replace V layer 1 by a dense layer that starts 2 bytes past an 8-byte boundary."""
    like = dev.v_buffer[1]
    flat = torch.zeros(like.numel() + 1, dtype=like.dtype, device=like.device)
    layer = flat[1:].view(like.shape)
    layer.copy_(like)
    dev.v_buffer[1] = layer
    return layer


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
def test_unaddressable_v_layer_refused_before_k_moves(layout: str) -> None:
    """V narrower than K (two launches): a V layer off the word grid changes nothing."""
    dev = device_pool(2, 8, 4)
    host = backend.create_host_pool(dev, layout=layout, io_backend="kernel")
    idx = torch.arange(PS, 3 * PS)
    host.backup_from_device_all_layer(dev, idx, idx.to(DEVICE), "kernel")
    host.synchronize()
    _misaligned_v_layer(dev)
    pools = (host.k_buffer, host.v_buffer, *dev.k_buffer, *dev.v_buffer)
    before = [raw(t) for t in pools]
    load_idx = torch.arange(2 * PS, 4 * PS).to(DEVICE)
    with pytest.raises(PoolMismatchError, match="8-byte boundary"):
        host.load_to_device_per_layer(dev, idx, load_idx, 1, "kernel")
    with pytest.raises(PoolMismatchError, match="8-byte boundary"):
        host.backup_from_device_all_layer(dev, idx, load_idx, "kernel")
    host.synchronize()
    after = [raw(t) for t in pools]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


def test_both_launches_checked_before_the_first_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the mover's own checks, the launch checks still refuse V before K moves."""
    monkeypatch.setattr(_movers.KernelMover, "check", lambda self, device_pool: None)
    dev = device_pool(2, 8, 4)
    host = backend.create_host_pool(dev, layout="page_first", io_backend="kernel")
    idx = torch.arange(PS, 3 * PS)
    host.backup_from_device_all_layer(dev, idx, idx.to(DEVICE), "kernel")
    host.synchronize()
    _misaligned_v_layer(dev)
    pools = (host.k_buffer, host.v_buffer, *dev.k_buffer, *dev.v_buffer)
    before = [raw(t) for t in pools]
    with pytest.raises(ShapeMismatchError, match="8-byte boundary"):
        host.load_to_device_per_layer(
            dev, idx, torch.arange(2 * PS, 4 * PS).to(DEVICE), 1, "kernel"
        )
    host.synchronize()
    after = [raw(t) for t in pools]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
