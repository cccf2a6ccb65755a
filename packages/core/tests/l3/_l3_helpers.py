"""Small pools with deterministic contents for the L3 store tests (also used by child processes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import sgl_core
from sgl_core import HostLayout
from sgl_core.l3 import page_keys

PAGE = 16
LAYERS = 4
KV_LORA = 64
ROPE = 16
DEV_TOKENS = 64
TORCH_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
LAYOUTS = (*TORCH_LAYOUTS, "split")
DEVICE_PAGES = (1, 2, 3)  # device slots 16..63 (slot page 0 holds the padding slot)


def tokens(first_page: int, pages: int) -> torch.Tensor:
    """Token indices of ``pages`` whole pages from page ``first_page``."""
    return torch.arange(first_page * PAGE, (first_page + pages) * PAGE, dtype=torch.int64)


class SplitHostPool:
    """A host pool with two objects per page of different sizes (k, v), like kv_split.

    Implements only the L3 helpers a page store uses.
    """

    layout = HostLayout.PAGE_FIRST_KV_SPLIT

    def __init__(self, pages: int = 8) -> None:
        self.page_size = PAGE
        self.size = pages * PAGE
        self.layer_num = LAYERS
        self.dtype = torch.bfloat16
        self.k = torch.zeros(pages, LAYERS, PAGE, 1, KV_LORA, dtype=self.dtype)
        self.v = torch.zeros(pages, LAYERS, PAGE, 1, ROPE, dtype=self.dtype)

    def _pages(self, indices: torch.Tensor | Sequence[int]) -> list[int]:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        if idx.numel() % PAGE:
            raise ValueError("indices are not whole pages")
        return [int(s) // PAGE for s in idx[::PAGE].tolist()]

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        ptrs, sizes = [], []
        for p in self._pages(indices):
            for buf in (self.k, self.v):
                ptrs.append(buf[p].data_ptr())
                sizes.append(buf[p].numel() * buf.element_size())
        return ptrs, sizes

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        bufs = (self.k, self.v)
        return (
            [b.data_ptr() for b in bufs],
            [b.numel() * b.element_size() for b in bufs],
            [b[0].numel() * b.element_size() for b in bufs],
        )

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        p = index // PAGE
        return torch.cat([self.k[p].flatten(), self.v[p].flatten()])

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        p = index // PAGE
        nk = self.k[p].numel()
        self.k[p].copy_(data_page[:nk].view_as(self.k[p]))
        self.v[p].copy_(data_page[nk:].view_as(self.v[p]))


def make_device(seed: int | None) -> Any:
    """A torch-backend device pool; filled with seeded random rows when ``seed`` is given."""
    backend = sgl_core.get_backend("torch")
    dev = backend.create_device_pool(
        size=DEV_TOKENS,
        page_size=PAGE,
        dtype=torch.bfloat16,
        kv_lora_rank=KV_LORA,
        qk_rope_head_dim=ROPE,
        layer_num=LAYERS,
    )
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
        loc = torch.arange(0, DEV_TOKENS + PAGE, dtype=torch.int64)
        for layer in range(LAYERS):
            nope = torch.randn(loc.numel(), 1, KV_LORA, generator=gen).to(torch.bfloat16)
            rope = torch.randn(loc.numel(), 1, ROPE, generator=gen).to(torch.bfloat16)
            dev.set_mla_kv_buffer(layer, loc, nope, rope)
    return dev


def make_host(layout: str, device: Any | None = None) -> Any:
    """A host pool of ``layout`` (8 pages); ``"split"`` is :class:`SplitHostPool`."""
    if layout == "split":
        return SplitHostPool()
    backend = sgl_core.get_backend("torch")
    dev = device if device is not None else make_device(None)
    return backend.create_host_pool(dev, layout=layout, io_backend="direct")


def filled_host(layout: str, seed: int, first_page: int = 2) -> tuple[Any, Any]:
    """``(host, device)``: device pages 1..3 backed up to host pages ``first_page``.. (3 pages)."""
    if layout == "split":
        host = SplitHostPool()
        gen = torch.Generator().manual_seed(seed)
        for i in range(len(DEVICE_PAGES)):
            flat = torch.randn(host.get_data_page(0).numel(), generator=gen).to(torch.bfloat16)
            host.set_from_flat_data_page((first_page + i) * PAGE, flat)
        return host, None
    dev = make_device(seed)
    host = make_host(layout, dev)
    host.backup_from_device_all_layer(
        dev, tokens(first_page, 3), tokens(DEVICE_PAGES[0], 3), "direct"
    )
    return host, dev


def page_bytes(host: Any, start: int) -> torch.Tensor:
    """The page at token ``start`` as raw int16 (bit-exact comparisons, NaN-safe)."""
    page: torch.Tensor = host.get_data_page(start)
    return page.view(torch.int16).clone()


def fill_sentinel(host: Any, first_page: int, pages: int, value: float = 7.0) -> None:
    """Overwrite whole host pages with a constant, to detect any unwanted write."""
    flat = torch.full_like(host.get_data_page(0), value)
    for p in range(first_page, first_page + pages):
        host.set_from_flat_data_page(p * PAGE, flat)


def device_matches(host: Any, host_first_page: int, reference: Any) -> bool:
    """Load host pages into a fresh device pool, layer by layer; compare with ``reference``."""
    dev2 = make_device(None)
    dev_loc = tokens(DEVICE_PAGES[0], 3)
    for layer in range(LAYERS):
        host.load_to_device_per_layer(dev2, tokens(host_first_page, 3), dev_loc, layer, "direct")
    for layer in range(LAYERS):
        a = reference.get_mla_kv_buffer(layer, dev_loc)
        b = dev2.get_mla_kv_buffer(layer, dev_loc)
        for x, y in zip(a, b, strict=True):
            if not torch.equal(x.view(torch.int16), y.view(torch.int16)):
                return False
    return True


def torch_host(
    layout: str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    kv_lora: int = KV_LORA,
    rope: int = ROPE,
    layers: int = LAYERS,
    seed: int | None = None,
) -> Any:
    """A torch-backend host pool of 8 pages; every page random bytes from ``seed`` if given."""
    backend = sgl_core.get_backend("torch")
    dev = backend.create_device_pool(
        size=DEV_TOKENS,
        page_size=PAGE,
        dtype=dtype,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        layer_num=layers,
    )
    host = backend.create_host_pool(dev, layout=layout, io_backend="direct")
    if seed is not None:
        fill_random(host, seed)
    return host


def fill_random(host: Any, seed: int) -> None:
    """Fill every host page with random bytes (any dtype; NaN patterns included)."""
    gen = torch.Generator().manual_seed(seed)
    for p in range(host.size // PAGE):
        flat = host.get_data_page(p * PAGE)
        nbytes = flat.numel() * flat.element_size()
        rnd = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
        host.set_from_flat_data_page(p * PAGE, rnd.view(flat.dtype))


def raw_page(host: Any, start: int) -> bytes:
    """The page at token ``start`` as raw bytes."""
    page: torch.Tensor = host.get_data_page(start)
    return bytes(page.contiguous().view(torch.uint8).numpy().tobytes())


def round_keys(namespace: str, r: int, pages: int = 3) -> list[str]:
    """Keys of round ``r`` of a writer: ``pages`` pages of fresh tokens."""
    first = r * pages * PAGE
    return page_keys(list(range(first, first + pages * PAGE)), PAGE, namespace=namespace)
