"""The wrapper's members against SGLang's own MLA host pool, built on CPU.

SGLang's ``MLATokenToKVPoolHost`` constructs on a CPU-only machine (its
transfers need sgl_kernel, its page helpers do not), so the storage-facing
members and the page bytes can be compared with the real thing.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest
import torch

import sgl_core
from sgl_core.errors import ArgumentTypeError, UnsupportedLayoutError
from sgl_core.integrations.sglang import wrap_host_pool

from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool  # isort: skip
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # isort: skip

PAGE, LAYERS, RANK, ROPE = 4, 3, 8, 4
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def _device_pool() -> MLATokenToKVPool:
    pool = MLATokenToKVPool(
        size=64, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE, layer_num=LAYERS, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(7)
    for layer in pool.kv_buffer:
        layer.copy_(torch.randn(layer.shape, generator=gen).to(layer.dtype))
    return pool


def _sglang_host(dev: MLATokenToKVPool, layout: str) -> MLATokenToKVPoolHost:
    return MLATokenToKVPoolHost(
        dev._mla_buffer_info(), 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=dev.size, start_layer=0, end_layer=LAYERS - 1,
        target_layer_num=LAYERS,
    )  # fmt: skip


def _bytes(ptrs: list[int], sizes: list[int]) -> list[bytes]:
    return [ctypes.string_at(p, n) for p, n in zip(ptrs, sizes, strict=True)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_members_and_page_bytes_match_sglang(layout: str) -> None:
    dev = _device_pool()
    ours = wrap_host_pool(sgl_core.get_backend("torch").create_host_pool(dev, layout=layout))
    theirs = _sglang_host(dev, layout)

    assert ours.layout == theirs.layout
    assert ours.page_size == theirs.page_size and ours.layer_num == theirs.layer_num
    assert ours.dtype == theirs.dtype
    assert ours.size_per_token == theirs.size_per_token
    assert ours.get_size_per_token() == theirs.get_size_per_token()
    assert ours.get_ksize_per_token() == theirs.get_ksize_per_token()
    assert ours.get_page_buffer_element_size() == theirs.get_page_buffer_element_size()
    assert ours.storage_format_tag == theirs.storage_format_tag is None
    assert (ours.dcp_size, ours.logical_page_size) == (theirs.dcp_size, theirs.logical_page_size)
    assert ours.logical_size == ours.size
    dummy, their_dummy = ours.get_dummy_flat_data_page(), theirs.get_dummy_flat_data_page()
    assert (dummy.numel(), dummy.dtype) == (their_dummy.numel(), their_dummy.dtype)

    # Back up two device pages into ours with SGLang's io name for the layout.
    src = torch.tensor([12, 13, 14, 15, 40, 41, 42, 43])
    h_idx = ours.alloc(8)
    assert h_idx is not None
    io = "direct" if layout != "page_first" else "kernel"
    ours.backup_from_device_all_layer(dev, h_idx, src, io)

    # Page meta: same object count and sizes; the bytes there are SGLang's page.
    sg_idx = torch.arange(8, 16)  # two other pages of SGLang's pool
    our_ptrs, our_sizes = ours.get_page_buffer_meta(h_idx)
    sg_ptrs, sg_sizes = theirs.get_page_buffer_meta(sg_idx)
    assert our_sizes == sg_sizes
    for p in range(2):
        theirs.set_from_flat_data_page(int(sg_idx[p * PAGE]), ours.get_data_page(h_idx[p * PAGE]))
    assert _bytes(our_ptrs, our_sizes) == _bytes(sg_ptrs, sg_sizes)

    # Independent: SGLang's own buffer view of those pages holds the device rows.
    for p in range(2):
        start = int(sg_idx[p * PAGE])
        tokens = src[p * PAGE : (p + 1) * PAGE]
        for layer in range(LAYERS):
            if layout == "layer_first":
                rows = theirs.kv_buffer[layer, start : start + PAGE]
            elif layout == "page_first":
                rows = theirs.kv_buffer[start : start + PAGE, layer]
            else:
                rows = theirs.kv_buffer[start // PAGE, layer]
            assert torch.equal(rows, dev.kv_buffer[layer][tokens])


def test_create_host_pool_takes_sglang_device_pool_with_default_pin() -> None:
    dev = _device_pool()
    assert isinstance(dev.device, str)
    for name in ("torch", "cuda"):
        host = sgl_core.get_backend(name).create_host_pool(dev, layout="layer_first")
        assert host.pin_memory is False  # a CPU device pool: nothing to pin for
        assert host.kv_buffer.data_ptr() % 4096 == 0


def test_stride_alignment_tells_the_truth() -> None:
    dev = _device_pool()
    answers = set()
    for layout in LAYOUTS:
        ours = wrap_host_pool(sgl_core.get_backend("torch").create_host_pool(dev, layout=layout))
        for align in (2, 32, 96, 4096):
            ptrs, _ = ours.get_page_buffer_meta(torch.arange(ours.size))
            truth = all(p % align == 0 for p in ptrs)
            assert ours.is_stride_page_aligned(align) is truth, (layout, align)
            answers.add(truth)
    assert answers == {True, False}  # the cases cover both answers
    with pytest.raises(ArgumentTypeError):
        ours.is_stride_page_aligned(0)


def test_wrapper_argument_errors() -> None:
    dev = _device_pool()
    ours = wrap_host_pool(sgl_core.get_backend("torch").create_host_pool(dev, layout="page_first"))
    with pytest.raises(UnsupportedLayoutError):
        ours.get_page_buffer_element_size(split_factor=2)
    with pytest.raises(ArgumentTypeError):
        ours.get_data_page(torch.tensor([0, 4]))
    with pytest.raises(ArgumentTypeError):
        ours.get_data_page(0.0)
    with pytest.raises(ArgumentTypeError):
        wrap_host_pool(dev)  # type: ignore[arg-type]


def test_integration_module_imports_no_sglang() -> None:
    code = (
        "import sys, sgl_core.integrations.sglang as m; "
        "bad = sorted(k for k in sys.modules if k == 'sglang' or k.startswith('sglang.')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
