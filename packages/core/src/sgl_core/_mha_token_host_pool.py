"""The torch backend's MHA host pool: K and V rows per (token, layer) in four layouts.

Host tensors, per component (``D`` = ``head_dim`` for K, ``v_head_dim`` for
V; ``H`` = ``head_num``, ``L`` = ``layer_num``, ``ps`` = ``page_size``),
as SGLang 0.5.23's ``MHATokenToKVPoolHost`` lays them out:

* ``layer_first``        ``(L, size, H, D)``
* ``page_first``         ``(size, L, H, D)``
* ``page_first_direct``  ``(page_num, L, ps, H, D)``
* ``page_head``          ``(page_num, H, ps, L, D)``

When ``head_dim == v_head_dim``, K and V are the two halves of one
``kv_buffer`` of ``(2, ...)`` (SGLang's byte order exactly); otherwise they
are two separate tensors. A flat L3 page is the page's K bytes, then its V
bytes, each in the layout's own order (docs/design.md section 5b).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from sgl_core._enums import HostLayout, IOBackend
from sgl_core._memory import page_aligned_zeros
from sgl_core._mha_device_pool import mha_device_layers
from sgl_core._mha_host_pool import MHAHostPoolBase
from sgl_core._mha_mover import MHADirectMover
from sgl_core._mha_protocols import MHADevicePool
from sgl_core._transfer import MHAMoverFactory
from sgl_core._validation import check_backed, check_layer_id
from sgl_core.errors import PoolMismatchError

__all__ = ["MHATokenHostPool"]


class MHATokenHostPool(MHAHostPoolBase):
    """``layer_first`` / ``page_first`` / ``page_first_direct`` / ``page_head`` MHA host pool."""

    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MHAMoverFactory]]] = {
        HostLayout.LAYER_FIRST: {IOBackend.DIRECT: MHADirectMover},
        HostLayout.PAGE_FIRST: {IOBackend.DIRECT: MHADirectMover},
        HostLayout.PAGE_FIRST_DIRECT: {IOBackend.DIRECT: MHADirectMover},
        HostLayout.PAGE_HEAD: {IOBackend.DIRECT: MHADirectMover},
    }

    #: ``(2, ...)``: K and V in one allocation (``head_dim == v_head_dim``), else None.
    kv_buffer: torch.Tensor | None
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor

    def _component_shape(self, dim: int) -> tuple[int, ...]:
        size, layers, heads, ps = self.size, self.layer_num, self.head_num, self.page_size
        return {
            HostLayout.LAYER_FIRST: (layers, size, heads, dim),
            HostLayout.PAGE_FIRST: (size, layers, heads, dim),
            HostLayout.PAGE_FIRST_DIRECT: (self.page_num, layers, ps, heads, dim),
            HostLayout.PAGE_HEAD: (self.page_num, heads, ps, layers, dim),
        }[self.layout]

    def _allocate_buffers(self, device_pool: MHADevicePool) -> None:
        pin = self.pin_memory
        if self.head_dim == self.v_head_dim:
            shape = (2, *self._component_shape(self.head_dim))
            self.kv_buffer = page_aligned_zeros(shape, self.dtype, pin_memory=pin)
            self.k_buffer, self.v_buffer = self.kv_buffer[0], self.kv_buffer[1]
            return
        self.kv_buffer = None
        self.k_buffer = page_aligned_zeros(
            self._component_shape(self.head_dim), self.dtype, pin_memory=pin
        )
        self.v_buffer = page_aligned_zeros(
            self._component_shape(self.v_head_dim), self.dtype, pin_memory=pin
        )

    def _is_page_granular(self, io_backend: IOBackend) -> bool:
        return self.layout in (HostLayout.PAGE_FIRST_DIRECT, HostLayout.PAGE_HEAD)

    def _device_pool_fingerprint(self, device_pool: MHADevicePool) -> tuple[object, ...]:
        # k_buffer/v_buffer are plain lists: a replaced layer tensor must be re-validated.
        k, v = mha_device_layers(device_pool)
        return (device_pool, *k, *v)

    def _check_device_pool_kind(self, device_pool: MHADevicePool) -> None:
        slots = device_pool.size + device_pool.page_size
        k_layers, v_layers = mha_device_layers(device_pool)
        for name, layers, dim in (
            ("k_buffer", k_layers, self.head_dim),
            ("v_buffer", v_layers, self.v_head_dim),
        ):
            expected = (slots, self.head_num, dim)
            for i, layer in enumerate(layers):
                if not isinstance(layer, torch.Tensor):
                    raise PoolMismatchError(f"device_pool.{name}[{i}] is not a torch.Tensor")
                if tuple(layer.shape) != expected or layer.dtype != self.dtype:
                    raise PoolMismatchError(
                        f"device_pool.{name}[{i}] has shape {tuple(layer.shape)} "
                        f"{layer.dtype}, expected {expected} {self.dtype}"
                    )
                check_backed(layer, f"device_pool.{name}[{i}]")

    def _layer_storage(self, device_pool: MHADevicePool, layer_id: int) -> Sequence[torch.Tensor]:
        k, v = mha_device_layers(device_pool)
        return (k[layer_id], v[layer_id])

    # ------------------------------------------------------------ host views
    def layer_views(
        self, device_pool: MHADevicePool, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(device_rows (slots, dim), host_pages (pages, page_size, dim))``: K, then V.

        One component per K and V, ``dim = head_num * head_dim``; ``page_head``
        keeps heads outside tokens, so there it is one component per (K or V,
        head) with ``dim = head_dim``. All are views of the pools' memory.
        """
        layer_id = check_layer_id(layer_id, self.layer_num)
        self.check_device_pool(device_pool)
        views: list[tuple[torch.Tensor, torch.Tensor]] = []
        ps, pages = self.page_size, self.page_num
        comps = zip((self.k_buffer, self.v_buffer), mha_device_layers(device_pool), strict=True)
        for host, layers in comps:
            dev = layers[layer_id]
            if self.layout is HostLayout.PAGE_HEAD:
                views += [(dev[:, h], host[:, h, :, layer_id]) for h in range(self.head_num)]
                continue
            if self.layout is HostLayout.LAYER_FIRST:
                rows = host[layer_id].view(pages, ps, -1)
            elif self.layout is HostLayout.PAGE_FIRST:
                rows = host[:, layer_id].view(pages, ps, -1)
            else:
                rows = host[:, layer_id].flatten(2)
            views.append((dev.view(dev.shape[0], -1), rows))
        return views

    # -------------------------------------------------------------- L3 pages
    def _page_views(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ps = self.page_size
        if self.layout is HostLayout.LAYER_FIRST:
            return self.k_buffer[:, index : index + ps], self.v_buffer[:, index : index + ps]
        if self.layout is HostLayout.PAGE_FIRST:
            return self.k_buffer[index : index + ps], self.v_buffer[index : index + ps]
        return self.k_buffer[index // ps], self.v_buffer[index // ps]

    @property
    def _k_page_numel(self) -> int:
        return self.page_size * self.layer_num * self.head_num * self.head_dim

    @property
    def flat_page_numel(self) -> int:
        return (
            self._k_page_numel + self.page_size * self.layer_num * self.head_num * self.v_head_dim
        )

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        """A copy of one page: flat, K then V; else ``(2, ...)`` (equal head dims only)."""
        self.synchronize()
        k, v = self._page_views(self._check_page_start(index))
        if flat:
            return torch.cat([k.flatten(), v.flatten()])
        if self.head_dim != self.v_head_dim:
            raise PoolMismatchError("flat=False needs head_dim == v_head_dim (K and V stack)")
        return torch.stack([k, v])

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.synchronize()
        k, v = self._page_views(self._check_page_start(index))
        self._check_flat_page(data_page, self.flat_page_numel)
        flat = data_page.reshape(-1)
        k.copy_(flat[: self._k_page_numel].view(k.shape))
        v.copy_(flat[self._k_page_numel :].view(v.shape))

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.flat_page_numel, dtype=self.dtype, pin_memory=self.pin_memory)

    def get_page_buffer_meta(
        self, indices: torch.Tensor | Sequence[int]
    ) -> tuple[list[int], list[int]]:
        starts = self._page_starts(indices)
        self.synchronize()  # the caller reads these bytes by address
        ptrs: list[int] = []
        sizes: list[int] = []
        item = self.k_buffer.element_size()
        for s in starts:
            for host in (self.k_buffer, self.v_buffer):
                row = host.shape[-1] * self.head_num * item
                base = host.data_ptr()
                if self.layout is HostLayout.LAYER_FIRST:
                    step = self.size * row
                    ptrs += [base + layer * step + s * row for layer in range(self.layer_num)]
                    sizes += [self.page_size * row] * self.layer_num
                else:  # every page-first layout keeps a page's layers contiguous
                    ptrs.append(base + s * self.layer_num * row)
                    sizes.append(self.page_size * self.layer_num * row)
        return ptrs, sizes

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        ptrs: list[int] = []
        totals: list[int] = []
        objects: list[int] = []
        for host in (self.k_buffer, self.v_buffer):
            row = host.shape[-1] * self.head_num * host.element_size()
            page = self.page_size * row
            ptrs.append(host.data_ptr())
            totals.append(host.numel() * host.element_size())
            objects.append(page if self.layout is HostLayout.LAYER_FIRST else page * self.layer_num)
        return ptrs, totals, objects


if TYPE_CHECKING:
    from sgl_core._mha_device_pool import PerLayerMHADevicePool
    from sgl_core._mha_protocols import MHAHostPool

    _host: MHAHostPool = MHATokenHostPool(
        PerLayerMHADevicePool(
            size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
        ),
        layout="page_head",
    )
