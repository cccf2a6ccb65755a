"""The one device-pool implementation of the Ascend backend: a contiguous tensor per component.

Each component of the kv-split spec is one row-major 5-D ``<name>_buffer``
(docs/design.md, device pools); there is no ``data_ptrs`` table and no
per-layer list: code that needs one of those must not receive this pool.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import torch

from sgl_ascend import _npu
from sgl_core.backend import (
    Component,
    KVSpec,
    byte_view,
    check_layer_id,
    check_value_rows,
    cpu_zeros,
)
from sgl_core.errors import PoolSizeError

__all__ = ["AscendDevicePool", "KvSplitSpec", "kv_split_spec"]


@dataclasses.dataclass(frozen=True)
class KvSplitSpec(KVSpec):
    """A kv-split spec: its flat page is raw bytes whenever an fp32 scale component exists.

    That is the page format Ascend pools have always stored (even when the KV
    dtype is float32 too), so it stays: the L3 format records the page dtype.
    """

    @property
    def flat_page_dtype(self) -> torch.dtype:
        return torch.uint8 if self.has("index_k_scale") else self.dtype


def kv_split_spec(spec: KVSpec, kv: tuple[Component, ...]) -> KvSplitSpec:
    """``spec`` with its every-layer rows replaced by ``kv`` (indexer rows kept, no stacking)."""
    subset = tuple(c for c in spec.components if c.layers is not None)
    return KvSplitSpec(spec.kind, spec.layer_num, spec.dtype, kv + subset, spec.identity)


#: ``(component, shape) -> its tensor``: allocated, or an engine's own (``engine_view``).
TensorSource = Callable[[Component, tuple[int, ...]], torch.Tensor]


class AscendDevicePool(abc.ABC):
    """Storage over a kv-split spec: one attribute ``<component>_buffer`` per component."""

    spec: KvSplitSpec
    k_buffer: torch.Tensor
    #: Buffer attributes a pool of the kind always has, None when its spec lacks them.
    optional_buffers: ClassVar[tuple[str, ...]] = ()

    if TYPE_CHECKING:  # from the kind's geometry (``MLAPoolGeometry`` / ``MHAPoolGeometry``)
        _device: torch.device

        @property
        def layer_num(self) -> int: ...
        @property
        def page_num(self) -> int: ...
        @property
        def page_size(self) -> int: ...
        @property
        def slot_count(self) -> int: ...
        @property
        def dtype(self) -> torch.dtype: ...

    def _pool_device(self, device: str | torch.device | None) -> torch.device:
        """``None``: the NPU when one is usable, else CPU (``sgl_ascend._npu``)."""
        return _npu.resolve_device(device)

    @abc.abstractmethod
    def _kv_split(self) -> KvSplitSpec:
        """This pool's kv-split spec, from its geometry (and the kind's own arguments)."""

    def _build(self, spec: KvSplitSpec, source: TensorSource | None = None) -> None:
        """Set ``spec`` and each component's buffer from ``source`` (None: zeros)."""
        self.spec = spec
        make = self._zeros if source is None else source
        for name in self.optional_buffers:
            setattr(self, name, None)
        for c in spec.components:
            setattr(self, c.device_name, make(c, self.component_shape(c)))

    def component_shape(self, c: Component) -> tuple[int, ...]:
        """``(rows, page_num, page_size, heads, dim)`` of component ``c``."""
        return (c.rows(self.layer_num), self.page_num, self.page_size, c.heads, c.dim)

    def _zeros(self, c: Component, shape: tuple[int, ...]) -> torch.Tensor:
        try:
            return cpu_zeros(shape, c.dtype, self._device)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            raise PoolSizeError(f"device pool does not fit on {self._device}: {exc}") from None

    # ------------------------------------------------------------ components
    @property
    def device(self) -> torch.device:
        return self.k_buffer.device

    @property
    def named_components(self) -> list[tuple[str, torch.Tensor]]:
        """``(attribute name, buffer)`` of each component present, in flat-page order."""
        names = [c.device_name for c in self.spec.components]
        return [(n, b) for n in names if (b := getattr(self, n, None)) is not None]

    @property
    def components(self) -> list[torch.Tensor]:
        """The buffers a host page mirrors, in flat-page order."""
        return [b for _, b in self.named_components]

    @property
    def kv_components(self) -> int:
        """How many leading components hold every layer's rows (MLA packed: 1; else 2)."""
        return sum(c.layers is None for c in self.spec.components)

    def indexer_slot(self, layer_id: int) -> int | None:
        """Row of ``layer_id`` in the indexer buffers, or None if it has no indexer row."""
        layer_id = check_layer_id(layer_id, self.layer_num)
        subset = [c for c in self.spec.components if c.layers is not None]
        return subset[0].slot(layer_id) if subset else None

    # ------------------------------------------------------------ token rows
    def _rows(self, buffer: torch.Tensor, row: int) -> torch.Tensor:
        """``(slot_count, heads, dim)`` view of one row (layer or slot) of a component.

        fp8 caches move as bytes (no fp8 index kernels); values are never converted.
        """
        return byte_view(buffer[row].view(self.slot_count, buffer.shape[-2], buffer.shape[-1]))

    def _write(self, layer_id: int, loc: torch.Tensor, rows: list[torch.Tensor]) -> None:
        """Copy checked byte ``rows`` into the leading components' rows of layer ``layer_id``."""
        for buffer, part in zip(self.components, rows, strict=False):
            self._rows(buffer, layer_id).index_copy_(0, loc, part)

    def _read(self, layer_id: int, loc: torch.Tensor, count: int) -> list[torch.Tensor]:
        """Copies of the first ``count`` components' rows at ``loc``, of the pool's dtype."""
        buffers = self.components[:count]
        return [self._rows(b, layer_id).index_select(0, loc).view(self.dtype) for b in buffers]

    def _values(self, name: str, t: object, shape: tuple[int, ...]) -> torch.Tensor:
        """Rows of ``shape`` and the pool's dtype, never converted, as device bytes."""
        rows = check_value_rows(t, name, shape, self.dtype)
        return byte_view(rows.to(self.device).contiguous())

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """``(page_num, page_size, heads, dim)`` view of one layer's ``k`` component."""
        return self.k_buffer[check_layer_id(layer_id, self.layer_num)]
