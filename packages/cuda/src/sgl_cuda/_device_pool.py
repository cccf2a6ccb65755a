"""CUDA MLA device pool: one tensor per layer plus a ``data_ptrs`` pointer table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import SupportsIndex, overload

import torch

from sgl_core.backend import PerLayerMLADevicePool, check_layer_id, parse_device
from sgl_core.errors import BackendUnavailableError, PoolMismatchError
from sgl_cuda.kvcacheio import interpreter_active

__all__ = ["CudaMLADevicePool", "resolve_device"]


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

    def _store(self, layer_id: int, tensor: torch.Tensor) -> None:
        super().__setitem__(layer_id, tensor)

    def _fixed(self, *args: object, **kwargs: object) -> None:
        raise TypeError("kv_buffer has one tensor per layer; its length is fixed")

    append = extend = insert = remove = clear = _fixed
    __delitem__ = __iadd__ = __imul__ = _fixed  # type: ignore[assignment]

    def pop(self, index: SupportsIndex = -1) -> torch.Tensor:
        raise TypeError("kv_buffer has one tensor per layer; its length is fixed")


class CudaMLADevicePool(PerLayerMLADevicePool):
    """Per-layer MLA KV cache on a CUDA device, with a pointer table for all-layer kernels.

    ``kv_buffer[layer]`` is a ``(size + page_size, 1, kv_cache_dim)`` tensor, each
    layer its own allocation; ``data_ptrs`` is a ``torch.uint64`` tensor on the
    pool's device with ``kv_buffer[layer].data_ptr()``. Replace a layer only
    through ``kv_buffer[i] = t`` or :meth:`set_kv_buffer`; the table follows
    (and is re-checked before each kernel transfer). ``kv_cache_dim`` (packed
    rows) and the indexer cache (``index_head_dim``, one tensor per indexer
    layer) are those of ``sgl_core.PerLayerMLADevicePool``.
    """

    layers_in_one_allocation = False

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        kv_cache_dim: int | None = None,
        index_head_dim: int | None = None,
        indexer_layer_ids: Iterable[int] | None = None,
        with_index_k_scale: bool = False,
    ) -> None:
        self._layers: _LayerBuffers | None = None
        self._ptr_list: list[int] = []
        super().__init__(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            layer_num=layer_num,
            device=resolve_device(device),
            kv_cache_dim=kv_cache_dim,
            index_head_dim=index_head_dim,
            indexer_layer_ids=indexer_layer_ids,
            with_index_k_scale=with_index_k_scale,
        )

    # ``PerLayerMLADevicePool.__init__`` assigns ``self.kv_buffer = [...]``.
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
        for i, tensor in enumerate(layers):
            self._check_layer_tensor(i, tensor, device)
        self._layers = _LayerBuffers(self, layers)
        self._ptr_list = [t.data_ptr() for t in layers]
        self._data_ptrs = torch.tensor(self._ptr_list, dtype=torch.uint64, device=device)

    @property
    def data_ptrs(self) -> torch.Tensor:
        """``torch.uint64`` table of ``kv_buffer[i].data_ptr()`` on the pool's device."""
        self.sync_data_ptrs()
        return self._data_ptrs

    def pointer_table(self, device_name: str) -> torch.Tensor:
        """The address table of the layers in attribute ``device_name`` (``kv_buffer``)."""
        if device_name != "kv_buffer":
            raise KeyError(device_name)
        return self.data_ptrs

    def sync_data_ptrs(self) -> None:
        """Refresh ``data_ptrs`` in place if any layer's storage moved (e.g. ``set_``)."""
        current = [t.data_ptr() for t in self.kv_buffer]
        if current != self._ptr_list:
            for i, tensor in enumerate(self.kv_buffer):
                self._check_layer_tensor(i, tensor, self.device)
            self._ptr_list = current
            self._data_ptrs.copy_(torch.tensor(current, dtype=torch.uint64))

    def set_kv_buffer(self, layer_id: int, tensor: torch.Tensor) -> None:
        """Replace layer ``layer_id``'s buffer; ``data_ptrs`` is updated in place."""
        layer_id = check_layer_id(layer_id, self.layer_num)
        self._check_layer_tensor(layer_id, tensor, self.device)
        assert self._layers is not None
        self._layers._store(layer_id, tensor)
        self.sync_data_ptrs()

    def _check_layer_tensor(
        self, layer_id: int, tensor: torch.Tensor, device: torch.device
    ) -> None:
        expected = (self.slot_count, 1, self.kv_cache_dim)
        if not isinstance(tensor, torch.Tensor):
            raise PoolMismatchError(f"kv_buffer[{layer_id}] must be a torch.Tensor")
        if (
            tuple(tensor.shape) != expected
            or tensor.dtype != self.dtype
            or tensor.device != device
            or not tensor.is_contiguous()
        ):
            raise PoolMismatchError(
                f"kv_buffer[{layer_id}] must be a contiguous {expected} {self.dtype} tensor "
                f"on {device}, got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"
            )

    @property
    def device(self) -> torch.device:
        return self._data_ptrs.device
