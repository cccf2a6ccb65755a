"""An engine's indexer cache kept in pages, mirrored by the token-row host pools.

SGLang's ``DSATokenToKVPool`` (DeepSeek-V3.2) keeps its indexer as one
``uint8`` tensor per model layer, ``index_k_with_scale_buffer[layer]`` of
shape ``(pages, page_size * (index_head_dim + 4))``: a page holds the
``index_head_dim``-byte keys (fp8) of its ``page_size`` tokens, then their
``page_size`` float32 scales. Token ``t`` sits at page ``t // page_size``,
offset ``t % page_size``. A layer that reuses the previous layer's top-k
holds a 0-page placeholder and has no indexer.

:class:`ForeignPagedIndexerPool` (made by ``as_device_pool``) reports that
indexer's configuration (``indexer_layer_ids``: the layers with pages;
``has_index_k_scale``), so a ``TokenRowHostPool`` mirrors it next to the KV
rows in its own layout (``sgl_core.kv.host._indexer_host``: a flat page is KV, keys,
scales). :class:`PagedIndexerPart` moves one component (keys or scales)
between the engine's pages and the host rows by (page, offset) on both sides.
Pooled (``index_kpool > 1``), tiled (ROCm preshuffle) or multi-scale layouts
are refused with ``PoolMismatchError``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch

from sgl_core.errors import PoolMismatchError
from sgl_core.kv._enums import HostLayout
from sgl_core.kv._layouts import layout_facts
from sgl_core.kv._validation import check_backed
from sgl_core.kv.device._foreign_pool import ForeignMLADevicePool
from sgl_core.kv.device._indexer import SCALE_BYTES, IndexerConfig
from sgl_core.transfer._transfer import Transfer

__all__ = [
    "ForeignPagedIndexerPool",
    "IndexerPagesView",
    "PagedIndexerPart",
    "has_paged_indexer",
    "paged_buffers",
]

_BUFFER = "index_k_with_scale_buffer"


def has_paged_indexer(pool: Any) -> bool:
    """True for an engine pool with a paged indexer that some layer uses."""
    buffers = getattr(pool, _BUFFER, None)
    return isinstance(buffers, list) and any(
        isinstance(t, torch.Tensor) and t.shape[0] > 0 for t in buffers
    )


@dataclasses.dataclass(frozen=True)
class PagedFormat:
    """Keys of ``index_head_dim`` bytes then one float32 scale per token, per page."""

    index_head_dim: int
    page_size: int
    layer_ids: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return self.page_size * (self.index_head_dim + SCALE_BYTES)


def _format(pool: Any) -> PagedFormat:
    """The engine pool's paged indexer format; ``PoolMismatchError`` for one not mirrored."""
    try:
        return _read_format(pool)
    except PoolMismatchError:
        raise
    except (AttributeError, TypeError, ValueError) as exc:
        raise PoolMismatchError(f"{type(pool).__name__}: bad paged indexer: {exc}") from None


def _read_format(pool: Any) -> PagedFormat:
    name = type(pool).__name__
    ps, dim = int(pool.page_size), getattr(pool, "index_head_dim", None)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise PoolMismatchError(f"{name}.index_head_dim must be a positive int, got {dim!r}")
    kpool = getattr(pool, "index_kpool", 1)
    block = getattr(pool, "quant_block_size", dim)
    if kpool != 1 or getattr(pool, "index_page_size", ps) != ps:
        raise PoolMismatchError(
            f"{name}: pooled index pages (index_kpool={kpool}) are not mirrored"
        )
    if block != dim:
        raise PoolMismatchError(
            f"{name}: {dim // block} scales per index key (quant_block_size={block}) are not "
            "mirrored (one float32 scale per token)"
        )
    cache = sys.modules.get("sglang.srt.mem_cache.index_key_cache")
    if getattr(cache, "_use_aiter_preshuffle", False):
        raise PoolMismatchError(f"{name}: preshuffled (tiled) index keys are not mirrored")
    buffers = getattr(pool, _BUFFER)
    if not isinstance(buffers, list) or len(buffers) != int(pool.layer_num):
        raise PoolMismatchError(f"{name}.{_BUFFER} must be a list of one tensor per layer")
    ids = tuple(i for i, t in enumerate(buffers) if isinstance(t, torch.Tensor) and t.shape[0])
    return PagedFormat(dim, ps, ids)


def paged_buffers(device_pool: object, fmt: PagedFormat) -> list[torch.Tensor]:
    """The engine's index buffers of the indexer layers; ``PoolMismatchError`` unless ``fmt``."""
    if not isinstance(device_pool, ForeignPagedIndexerPool):
        raise PoolMismatchError(
            f"{type(device_pool).__name__} has no paged indexer cache (the host pool mirrors one)"
        )
    theirs = device_pool.paged_format
    if theirs != fmt:
        raise PoolMismatchError(f"device pool's paged indexer is {theirs}, expected {fmt}")
    buffers: list[torch.Tensor] = getattr(device_pool.wrapped, _BUFFER)
    slots = device_pool.size + device_pool.page_size
    for layer in fmt.layer_ids:
        t = buffers[layer] if layer < len(buffers) else None
        where = f"device_pool.{_BUFFER}[{layer}]"
        if (
            not isinstance(t, torch.Tensor)
            or t.dtype != torch.uint8
            or t.dim() != 2
            or t.shape[1] != fmt.row_bytes
            or t.shape[0] * fmt.page_size < slots
            or t.stride(1) != 1
            or t.device != device_pool.device
        ):
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t)
            raise PoolMismatchError(
                f"{where} must be a uint8 (pages >= {slots // fmt.page_size}, {fmt.row_bytes}) "
                f"tensor with unit row stride on {device_pool.device}, got {got}"
            )
        check_backed(t, where)
    return [buffers[layer] for layer in fmt.layer_ids]


class ForeignPagedIndexerPool(ForeignMLADevicePool):
    """An engine's MLA pool with a paged indexer, seen through ``MLADevicePool`` and
    ``indexer_of``; the indexer's pages stay the engine's tensors."""

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.paged_format = _format(pool)

    @property
    def index_head_dim(self) -> int:
        return self.paged_format.index_head_dim

    @property
    def indexer_layer_ids(self) -> tuple[int, ...]:
        return self.paged_format.layer_ids

    @property
    def has_index_k_scale(self) -> bool:
        return True

    def index_buffers(self) -> list[torch.Tensor]:
        """The engine's own buffers of the indexer layers (for fingerprints), unchecked."""
        buffers: list[torch.Tensor] = getattr(self.wrapped, _BUFFER)
        return [buffers[i] for i in self.paged_format.layer_ids]


class IndexerPagesView(ForeignMLADevicePool):
    """An engine's paged indexer as an MLA device pool whose "tokens" are its pages.

    SGLang's ``DSAIndexerPoolHost`` copies whole index pages: one ``page_size *
    (index_head_dim + 4)``-byte row per page and indexer layer. This view
    shows exactly that as the one KV model's terms, so our host pools and
    movers (any backend, layout and io) move the engine's index pages
    unchanged: ``page_size`` 1 (a slot is one engine page), ``layer_num`` the
    layers with pages (``indexer_layer_ids``, in order), ``kv_buffer[i]`` the
    engine's ``index_k_with_scale_buffer[indexer_layer_ids[i]]`` seen as
    ``(pages, 1, row)`` ``uint8`` (no copy), the keys as the ``kv_lora_rank``
    part of a row and the scales as its ``qk_rope_head_dim`` part; ``size`` is
    the pages less page 0, the engine's padding page. Refused
    (``PoolMismatchError``): a pool without a paged indexer, or one whose
    indexer layers hold different page counts.
    """

    _lists = (_BUFFER,)

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        fmt = _format(pool)
        if not fmt.layer_ids:
            raise PoolMismatchError(f"{type(pool).__name__} has no layer with index pages")
        buffers = getattr(pool, _BUFFER)
        pages = {int(buffers[i].shape[0]) for i in fmt.layer_ids}
        if len(pages) != 1:
            raise PoolMismatchError(
                f"{type(pool).__name__}: indexer layers hold different page counts {sorted(pages)}"
            )
        #: The engine's page format (the same value ``ForeignPagedIndexerPool`` reports).
        self.paged_format = fmt
        self._pages = pages.pop()

    @property
    def size(self) -> int:
        return self._pages - 1

    @property
    def page_size(self) -> int:
        return 1

    @property
    def token_page_size(self) -> int:
        """The engine's page size in tokens (tokens per slot of this view)."""
        return self.paged_format.page_size

    @property
    def layer_num(self) -> int:
        return len(self.paged_format.layer_ids)

    @property
    def kv_buffer(self) -> list[torch.Tensor]:
        # Views made on every call: a layer the engine replaced is seen as it is now.
        buffers: list[torch.Tensor] = getattr(self._pool, _BUFFER)
        return [buffers[i].unsqueeze(1) for i in self.paged_format.layer_ids]

    @property
    def kv_lora_rank(self) -> int:
        return self.paged_format.page_size * self.paged_format.index_head_dim

    @property
    def qk_rope_head_dim(self) -> int:
        return self.paged_format.page_size * SCALE_BYTES

    @property
    def kv_cache_dim(self) -> int:
        return self.paged_format.row_bytes

    @property
    def dtype(self) -> torch.dtype:
        return torch.uint8


class PagedIndexerPart:
    """Moves one indexer component between an engine's pages and a host buffer.

    ``host`` is the component's host buffer (``host_shape`` layout, one row
    per indexer slot); ``scales`` picks the float32 scales, else the keys.
    """

    def __init__(
        self, host: torch.Tensor, layout: HostLayout, cfg: IndexerConfig, scales: bool
    ) -> None:
        self.host = host.view(torch.uint8)
        self.layout = layout
        self.cfg = cfg
        self.scales = scales
        self.width = SCALE_BYTES if scales else cfg.index_head_dim

    def _host_pages(self, slot: int, page_size: int) -> torch.Tensor:
        """``(pages, page_size, width)`` bytes of one slot (a view of the host buffer)."""
        return layout_facts(self.layout).row(self.host, slot).view(-1, page_size, self.width)

    def _device_pages(self, buffer: torch.Tensor, page_size: int) -> torch.Tensor:
        keys = page_size * self.cfg.index_head_dim
        part = buffer[:, keys:] if self.scales else buffer[:, :keys]
        return part.view(buffer.shape[0], page_size, self.width)

    def _move(self, transfer: Transfer, slot: int, to_host: bool) -> None:
        pool = transfer.device_pool
        assert isinstance(pool, ForeignPagedIndexerPool)
        ps = pool.page_size
        buffer = getattr(pool.wrapped, _BUFFER)[self.cfg.layer_ids[slot]]
        dev, host = self._device_pages(buffer, ps), self._host_pages(slot, ps)
        d = transfer.device_indices.to(dev.device)
        h = transfer.host_indices.to(host.device)
        if to_host:
            host[h // ps, h % ps] = dev[d // ps, d % ps].to(host.device)
        else:
            dev[d // ps, d % ps] = host[h // ps, h % ps].to(dev.device)

    def backup(self, transfer: Transfer) -> None:
        for slot in range(len(self.cfg.layer_ids)):
            self._move(transfer, slot, to_host=True)

    def load(self, transfer: Transfer, layer_id: int) -> None:
        """Host -> device, indexer slot ``layer_id`` (``IndexerMover`` passes the slot)."""
        self._move(transfer, layer_id, to_host=False)
