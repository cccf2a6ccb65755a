"""The engine's index pages as our INDEXER entry sees them.

One cached ``IndexerPagesView`` per engine pool (so the load memo of the
entry's host pool sees the same device pool on every layer), and SGLang's
token indices turned into page indices once they are checked to be whole,
aligned page runs.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from sgl_core.errors import ArgumentTypeError, IndexDTypeError, IndexShapeError, PageAlignmentError
from sgl_core.kv.device._paged_indexer import IndexerPagesView

__all__ = ["indexer_pages", "page_runs"]

_views: weakref.WeakKeyDictionary[Any, IndexerPagesView] = weakref.WeakKeyDictionary()


def indexer_pages(pool: Any) -> IndexerPagesView:
    """The engine pool's cached ``IndexerPagesView`` (one per pool, so load memos match)."""
    view = _views.get(pool)
    if view is None or view.wrapped is not pool:
        view = IndexerPagesView(pool)
        _views[pool] = view
    return view


def page_runs(indices: object, page_size: int, name: str) -> torch.Tensor:
    """The pages of ``indices``: whole, aligned runs of ``page_size`` token indices."""
    if not isinstance(indices, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise IndexDTypeError(f"{name} must be int32 or int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise IndexShapeError(f"{name} must be 1-D, got shape {tuple(indices.shape)}")
    if indices.numel() % page_size:
        raise PageAlignmentError(
            f"{name}: {indices.numel()} indices are not whole pages of {page_size} tokens "
            "(the indexer moves whole pages)"
        )
    runs = indices.to("cpu", torch.int64).view(-1, page_size)
    starts = runs[:, 0]
    expected = starts[:, None] + torch.arange(page_size)
    if bool((starts % page_size).any()) or not torch.equal(runs, expected):
        raise PageAlignmentError(
            f"{name} must be runs of whole, aligned pages of {page_size} tokens"
        )
    return starts // page_size
