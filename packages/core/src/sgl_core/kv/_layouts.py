"""The token-row host layouts as data: one small table of facts per layout.

A host buffer holds one component (``sgl_core.kv._spec``) for ``size``
tokens, ``R`` rows per token (its layers or indexer slots), ``H`` heads of
``D`` elements, ``ps`` tokens per page, ``P = size / ps`` pages:

============================  ====================  ================  =============
layout                        buffer shape          a row's tokens    a page's part
============================  ====================  ================  =============
``layer_first``               ``(R, size, H, D)``   ``buf[r]``        ``buf[:, s:s+ps]``
``page_first``                ``(size, R, H, D)``   ``buf[:, r]``     ``buf[s:s+ps]``
``page_first_direct``         ``(P, R, ps, H, D)``  ``buf[:, r]``     ``buf[s // ps]``
``page_first_kv_split``       ``(P, R, ps, H, D)``  ``buf[:, r]``     ``buf[s // ps]``
``page_head``                 ``(P, H, ps, R, D)``  ``buf[..., r, :]`` ``buf[s // ps]``
============================  ====================  ================  =============

Flat pages, memory objects and ``page_first_kv_split`` (only ``sgl_ascend``
builds it): docs/design.md section 5, "Layouts as data".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from sgl_core.kv._enums import HostLayout

__all__ = ["LayoutFacts", "layout_facts"]


@dataclasses.dataclass(frozen=True)
class LayoutFacts:
    """What a host layout is, as data (see the module table)."""

    #: ``(rows, size, page_size, heads, dim) -> buffer shape``.
    shape: Callable[[int, int, int, int, int], tuple[int, ...]]
    #: ``(buffer, row) -> that row's tokens``: ``(size, H, D)``, ``(P, ps, H, D)``
    #: or ``(P, H, ps, D)``.
    row: Callable[[torch.Tensor, int], torch.Tensor]
    #: ``(buffer, start, page_size) -> the page at token start``.
    page: Callable[[torch.Tensor, int, int], torch.Tensor]
    #: Transfers move whole, aligned pages only.
    paged: bool
    #: ``(H, D)`` are the innermost dims (every layout but ``page_head``).
    heads_inner: bool
    #: One (row, run) is one contiguous byte range (memmove by address).
    addressable: bool
    #: Rows are the outermost dim (``layer_first``): a page's rows lie ``size``
    #: tokens apart, one memory object each; else one object per component.
    rows_outer: bool


_FACTS = {
    HostLayout.LAYER_FIRST: LayoutFacts(
        shape=lambda r, size, ps, h, d: (r, size, h, d),
        row=lambda buf, r: buf[r],
        page=lambda buf, s, ps: buf[:, s : s + ps],
        paged=False,
        heads_inner=True,
        addressable=True,
        rows_outer=True,
    ),
    HostLayout.PAGE_FIRST: LayoutFacts(
        shape=lambda r, size, ps, h, d: (size, r, h, d),
        row=lambda buf, r: buf[:, r],
        page=lambda buf, s, ps: buf[s : s + ps],
        paged=False,
        heads_inner=True,
        addressable=False,
        rows_outer=False,
    ),
    HostLayout.PAGE_FIRST_DIRECT: LayoutFacts(
        shape=lambda r, size, ps, h, d: (size // ps, r, ps, h, d),
        row=lambda buf, r: buf[:, r],
        page=lambda buf, s, ps: buf[s // ps],
        paged=True,
        heads_inner=True,
        addressable=True,
        rows_outer=False,
    ),
    HostLayout.PAGE_HEAD: LayoutFacts(
        shape=lambda r, size, ps, h, d: (size // ps, h, ps, r, d),
        row=lambda buf, r: buf[:, :, :, r],
        page=lambda buf, s, ps: buf[s // ps],
        paged=True,
        heads_inner=False,
        addressable=False,
        rows_outer=False,
    ),
}
# The same facts under the Ascend name: its page is per component exactly a page_first_direct one.
_FACTS[HostLayout.PAGE_FIRST_KV_SPLIT] = _FACTS[HostLayout.PAGE_FIRST_DIRECT]


def layout_facts(layout: HostLayout) -> LayoutFacts:
    """The facts of a token-row layout (``KeyError`` for another layout)."""
    return _FACTS[layout]
