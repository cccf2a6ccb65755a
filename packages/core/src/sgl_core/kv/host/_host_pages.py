"""L3 page helpers of host pools that keep their components in token-row layouts.

Page parts: ``sgl_core.kv._layouts``; flat-page order and memory objects:
docs/design.md sections 5 ("Layouts as data") and 5a ("Flat pages and page meta").
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch

from sgl_core.errors import PoolMismatchError, ShapeMismatchError
from sgl_core.kv._layouts import LayoutFacts
from sgl_core.kv._validation import (
    as_index_tensor,
    check_index_bounds,
    check_page_runs,
    check_value_tensor,
)
from sgl_core.kv.host._host_pool import DevT, HostPoolBase, ShapeT
from sgl_core.transfer._transfer import HostPart

__all__ = ["TokenPages"]


class TokenPages(HostPoolBase[DevT, ShapeT], abc.ABC):
    """``get_data_page`` and the other page helpers, from ``_parts`` and the layout facts."""

    _parts: tuple[HostPart, ...]
    _facts: LayoutFacts

    def _page(self, part: HostPart, start: int) -> torch.Tensor:
        return self._facts.page(part.buffer, start, self.page_size)

    def _part_bytes(self) -> list[int]:
        """Bytes of each part of one page, in flat-page order."""
        rows = self.spec.layer_num
        return [
            self.page_size * p.component.rows(rows) * p.component.row_bytes for p in self._parts
        ]

    @property
    def flat_page_numel(self) -> int:
        return sum(self._part_bytes()) // self.spec.flat_page_dtype.itemsize

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of one page: flat, components in order; else its part (one component),
        the parts stacked (MHA, equal head dims), or flat (mixed parts)."""
        self.synchronize()  # transfers may still be queued on a stream
        start = self._check_page_start(index)
        pages = [self._page(p, start) for p in self._parts]
        if len(pages) == 1:
            return pages[0].flatten().clone() if flat else pages[0].clone()
        if not flat and self.spec.stacked:
            if len({p.shape for p in pages}) != 1:
                raise PoolMismatchError("flat=False needs head_dim == v_head_dim (K and V stack)")
            return torch.stack(pages)
        if self.spec.flat_page_dtype == torch.uint8:
            return torch.cat([p.contiguous().view(-1).view(torch.uint8) for p in pages])
        return torch.cat([p.flatten() for p in pages])

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.synchronize()
        start = self._check_page_start(index)
        numel, dtype = self.flat_page_numel, self.spec.flat_page_dtype
        check_value_tensor(data_page, "data_page")
        if data_page.dtype != dtype or data_page.numel() != numel:
            raise ShapeMismatchError(
                f"data_page must hold {numel} elements of {dtype}, "
                f"got {data_page.numel()} of {data_page.dtype}"
            )
        flat = data_page.reshape(-1).contiguous().view(torch.uint8)
        offset = 0
        for part, nbytes in zip(self._parts, self._part_bytes(), strict=True):
            page = self._page(part, start)
            chunk = flat[offset : offset + nbytes].clone()  # aligned for the dtype view
            offset += nbytes
            page.copy_(chunk.view(part.buffer.dtype).reshape(page.shape))

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(
            self.flat_page_numel, dtype=self.spec.flat_page_dtype, pin_memory=self.pin_memory
        )

    def _objects(self, part: HostPart, start: int) -> list[tuple[int, int]]:
        """``(address, bytes)`` of one part's memory objects of the page at ``start``."""
        row, rows = part.component.row_bytes, part.component.rows(self.spec.layer_num)
        base = part.buffer.data_ptr()
        if self._facts.rows_outer:
            return [
                (base + (r * self.size + start) * row, self.page_size * row) for r in range(rows)
            ]
        # Every page-first layout keeps a page's rows contiguous at start * rows * row.
        return [(base + start * rows * row, self.page_size * rows * row)]

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        tensor = as_index_tensor(indices, "indices").to("cpu")
        check_index_bounds(tensor, self.size, "indices")
        check_page_runs(tensor, self.page_size, "indices")
        starts: list[int] = tensor[:: self.page_size].tolist()
        self.synchronize()  # the caller reads these bytes by address
        objects = [o for s in starts for p in self._parts for o in self._objects(p, s)]
        return [a for a, _ in objects], [n for _, n in objects]

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        bases, totals, sizes = [], [], []
        for part in self._parts:
            bases.append(part.buffer.data_ptr())
            totals.append(part.buffer.numel() * part.buffer.element_size())
            sizes.append(self._objects(part, 0)[0][1])
        return bases, totals, sizes
