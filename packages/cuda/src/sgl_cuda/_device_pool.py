"""CUDA device pools: one tensor per layer (MLA; MHA K and V) plus their pointer tables."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, SupportsIndex, overload

import torch

from sgl_core.backend import (
    PerLayerMHADevicePool,
    PerLayerMLADevicePool,
    check_layer_id,
    parse_device,
)
from sgl_core.errors import BackendUnavailableError, PoolMismatchError
from sgl_cuda.kvcacheio import interpreter_active

__all__ = ["CudaMHADevicePool", "CudaMLADevicePool", "LayerTables", "resolve_device"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device a CUDA pool lives on, or ``BackendUnavailableError``.

    ``None`` means the current CUDA device. CPU tensors are accepted only when
    the Triton kernels run in the interpreter (``TRITON_INTERPRET=1``), for
    development and CI on machines without a GPU.
    """
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if interpreter_active():
            return torch.device("cpu")
        raise BackendUnavailableError(
            "the cuda backend needs a CUDA device and none is available here; "
            "set TRITON_INTERPRET=1 to run its kernels on CPU tensors, "
            "or use the portable 'torch' backend"
        )
    resolved = parse_device(device)
    assert resolved is not None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                f"device={str(device)!r}: torch reports no CUDA device here; "
                "set TRITON_INTERPRET=1 and use device='cpu' to run the kernels on CPU"
            )
        if str(resolved) == "cuda":  # no index: the current device
            resolved = torch.device("cuda", torch.cuda.current_device())
        return resolved
    if resolved.type == "cpu":
        if interpreter_active():
            return resolved
        raise BackendUnavailableError(
            "device='cpu' works with the cuda backend only under the Triton "
            "interpreter: set TRITON_INTERPRET=1 before the first transfer"
        )
    raise BackendUnavailableError(
        f"device={str(device)!r}: the cuda backend runs on 'cuda' (or 'cpu' under "
        "TRITON_INTERPRET=1)"
    )


class LayerTables:
    """The ``torch.uint64`` address tables of a device pool's per-layer lists.

    One table per list attribute (``kv_buffer``; ``k_buffer``/``v_buffer``) on
    the pool's device. A table is refreshed *in place* (holders of it stay
    valid) when a layer was replaced or re-pointed (``set_``), after the new
    layers are checked: ``layer_num`` of them, each a contiguous tensor of the
    list's shape, the pool's dtype, on its device.
    """

    def __init__(
        self,
        pool: Any,
        shapes: Mapping[str, tuple[int, ...]],
        device: torch.device,
    ) -> None:
        self._pool = pool
        self.shapes = dict(shapes)
        self.device = device
        self._ptrs = {name: self._addresses(name) for name in shapes}
        self._tables = {
            name: torch.tensor(ptrs, dtype=torch.uint64, device=device)
            for name, ptrs in self._ptrs.items()
        }

    def _addresses(self, name: str) -> list[int]:
        layers = getattr(self._pool, name)
        return [t.data_ptr() if isinstance(t, torch.Tensor) else 0 for t in layers]

    def table(self, name: str) -> torch.Tensor:
        """The table of ``name``, refreshed first if a layer's address changed."""
        self.sync(name)
        return self._tables[name]

    def sync(self, name: str) -> None:
        layers = getattr(self._pool, name)
        count = self._pool.layer_num
        if len(layers) != count:
            raise PoolMismatchError(f"{name} must hold {count} layer tensors, got {len(layers)}")
        current = self._addresses(name)
        if current != self._ptrs[name]:
            for i, tensor in enumerate(layers):
                self.check(name, i, tensor)
            self._tables[name].copy_(torch.tensor(current, dtype=torch.uint64))
            self._ptrs[name] = current

    def check(self, name: str, layer_id: int, tensor: object) -> None:
        """``tensor`` may be layer ``layer_id`` of ``name``, or ``PoolMismatchError``."""
        check_layer(name, layer_id, tensor, self.shapes[name], self._pool.dtype, self.device)


def check_layer(
    name: str,
    layer_id: int,
    tensor: object,
    expected: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """``tensor`` is a contiguous ``expected`` tensor of ``dtype`` on ``device``, or
    ``PoolMismatchError`` naming ``name[layer_id]``."""
    if not isinstance(tensor, torch.Tensor):
        raise PoolMismatchError(f"{name}[{layer_id}] must be a torch.Tensor")
    if (
        tuple(tensor.shape) != expected
        or tensor.dtype != dtype
        or tensor.device != device
        or not tensor.is_contiguous()
    ):
        raise PoolMismatchError(
            f"{name}[{layer_id}] must be a contiguous {expected} {dtype} tensor on "
            f"{device}, got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"
        )


class _LayerBuffers(list[torch.Tensor]):
    """``kv_buffer``: a fixed-length list whose item assignment updates ``data_ptrs``."""

    def __init__(self, pool: CudaMLADevicePool, layers: Iterable[torch.Tensor]) -> None:
        super().__init__(layers)
        self._pool = pool

    @overload
    def __setitem__(self, key: SupportsIndex, value: torch.Tensor) -> None: ...
    @overload
    def __setitem__(self, key: slice, value: Iterable[torch.Tensor]) -> None: ...
    def __setitem__(
        self, key: SupportsIndex | slice, value: torch.Tensor | Iterable[torch.Tensor]
    ) -> None:
        if isinstance(key, slice):
            raise TypeError("kv_buffer layers are replaced one at a time: kv_buffer[i] = tensor")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"kv_buffer[{key}] must be a torch.Tensor")
        self._pool.set_kv_buffer(int(key), value)

    def _fixed(self, *args: object, **kwargs: object) -> None:
        raise TypeError("kv_buffer has one tensor per layer; its length is fixed")

    append = extend = insert = remove = clear = _fixed
    __delitem__ = __iadd__ = __imul__ = _fixed  # type: ignore[assignment]

    def pop(self, index: SupportsIndex = -1) -> torch.Tensor:
        raise TypeError("kv_buffer has one tensor per layer; its length is fixed")


class _CudaLayers:
    """What both CUDA device pools share: per-layer allocations and their address tables."""

    layers_in_one_allocation = False
    _tables: LayerTables

    def _pool_device(self, device: str | torch.device | None) -> torch.device:
        return resolve_device(device)

    def pointer_table(self, device_name: str) -> torch.Tensor:
        """The address table of the layers in attribute ``device_name`` (e.g. ``kv_buffer``)."""
        return self._tables.table(device_name)

    def sync_data_ptrs(self) -> None:
        """Check replaced layers and refresh the tables in place if any layer's storage
        moved (e.g. ``set_``)."""
        for name in self._tables.shapes:
            self._tables.sync(name)


class CudaMLADevicePool(_CudaLayers, PerLayerMLADevicePool):
    """Per-layer MLA KV cache on a CUDA device, with a pointer table for all-layer kernels.

    Shapes and ``data_ptrs``: docs/design.md section 5a. Replace a layer only
    through ``kv_buffer[i] = t`` or :meth:`set_kv_buffer`; the table follows
    (and is re-checked before each kernel transfer).
    """

    _layers: _LayerBuffers | None = None

    # ``PerLayerMLADevicePool._allocate`` assigns ``self.kv_buffer = [...]``.
    @property
    def kv_buffer(self) -> list[torch.Tensor]:
        assert self._layers is not None
        return self._layers

    @kv_buffer.setter
    def kv_buffer(self, layers: list[torch.Tensor]) -> None:
        layers = list(layers)
        if len(layers) != self.layer_num:
            raise PoolMismatchError(
                f"kv_buffer must hold {self.layer_num} layer tensors, got {len(layers)}"
            )
        device = layers[0].device if self._layers is None else self.device
        shape = (self.slot_count, 1, self.kv_cache_dim)
        for i, tensor in enumerate(layers):  # before any layer is kept
            check_layer("kv_buffer", i, tensor, shape, self.dtype, device)
        self._layers = _LayerBuffers(self, layers)
        self._tables = LayerTables(self, {"kv_buffer": shape}, device)

    @property
    def data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``kv_buffer[i].data_ptr()`` on the pool's device."""
        return self._tables.table("kv_buffer")

    def set_kv_buffer(self, layer_id: int, tensor: torch.Tensor) -> None:
        """Replace layer ``layer_id``'s buffer; ``data_ptrs`` is updated in place."""
        layer_id = check_layer_id(layer_id, self.layer_num)
        self._tables.check("kv_buffer", layer_id, tensor)
        assert self._layers is not None
        list.__setitem__(self._layers, layer_id, tensor)  # past _LayerBuffers' own check
        self.sync_data_ptrs()

    @property
    def device(self) -> torch.device:
        return self._tables.device


class CudaMHADevicePool(_CudaLayers, PerLayerMHADevicePool):
    """Per-layer MHA/GQA KV cache on a CUDA device, with pointer tables for all-layer kernels.

    Shapes and ``k_data_ptrs``/``v_data_ptrs``: docs/design.md section 5b. A
    layer replaced in the lists (or re-pointed with ``set_``) is checked and
    the tables updated in place the next time they are read.
    """

    def _allocate(self) -> None:
        super()._allocate()
        shapes = {"k_buffer": (self.slot_count, self.head_num, self.head_dim)}
        shapes["v_buffer"] = (self.slot_count, self.head_num, self.v_head_dim)
        self._tables = LayerTables(self, shapes, self.device)

    @property
    def k_data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``k_buffer[i].data_ptr()`` on the pool's device."""
        return self._tables.table("k_buffer")

    @property
    def v_data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``v_buffer[i].data_ptr()`` on the pool's device."""
        return self._tables.table("v_buffer")

    @property
    def device(self) -> torch.device:
        return self._device
