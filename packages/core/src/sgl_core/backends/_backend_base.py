"""Plumbing shared by backends whose pools are one device and one host class, and ``torch``:
the portable backend (:class:`TorchBackend`; docs/design.md sections 4 and 10)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar, overload

import torch
from typing_extensions import Unpack

from sgl_core.errors import UnsupportedLayoutError
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.device._device_pool import PerLayerMHADevicePool, PerLayerMLADevicePool
from sgl_core.kv.device._engine_views import as_device_pool, as_mha_device_pool
from sgl_core.kv.host._host_kinds import MHAHostPoolBase, MLAHostPoolBase
from sgl_core.kv.host._token_host_pool import MHATokenHostPool, TokenRowHostPool
from sgl_core.kv.protocols._kv_protocols import (
    HostPoolOptions,
    MHADevicePool,
    MHAHostPool,
    MHAPoolArgs,
    MLADevicePool,
    MLAPoolArgs,
    is_mha_device_pool,
)
from sgl_core.transfer.copy._tuning import CopyTuning

__all__ = ["PoolBackend", "TorchBackend", "backend"]

DeviceT = TypeVar("DeviceT", bound=MLADevicePool)
HostT = TypeVar("HostT", bound=MLAHostPoolBase)


class PoolBackend(Generic[DeviceT, HostT]):
    """A ``Backend`` built from a device-pool factory and a host-pool class, and optionally
    the MHA pair of them (docs/design.md sections 4 and 5b, "For backend authors")."""

    name = "unnamed"
    #: io backends from fastest to slowest on this backend's device; ``default_io``
    #: returns the first one a layout runs. Backends override it.
    io_preference: ClassVar[tuple[IOBackend, ...]] = (
        IOBackend.KERNEL,
        IOBackend.KERNEL_ASCEND,
        IOBackend.DIRECT,
    )

    def __init__(
        self,
        device_pool_class: Callable[..., DeviceT],
        host_pool_class: type[HostT],
        *,
        tuning: CopyTuning | None = None,
        mha_device_pool_class: Callable[..., MHADevicePool] | None = None,
        mha_host_pool_class: type[MHAHostPoolBase] | None = None,
    ) -> None:
        self._device_pool_class = device_pool_class
        self._host_pool_class = host_pool_class
        self._mha_device_pool_class = mha_device_pool_class
        self._mha_host_pool_class = mha_host_pool_class
        #: Given to every host pool this backend builds (None: each device's preset).
        self.tuning = tuning

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def supported_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        return self._host_pool_class.supported_pairs

    @property
    def supported_mha_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        """Host layouts this backend builds for MHA pools (the MHA host class's)."""
        host = self._mha_host_pool_class
        return {} if host is None else host.supported_pairs

    def is_available(self) -> bool:
        return True

    def default_io(self, layout: HostLayout | str) -> IOBackend:
        """The io backend to use for ``layout``: its fast path, the same on every call.

        The first entry of ``io_preference`` that ``supported_pairs[layout]``
        holds (io backends missing from ``io_preference`` come after it, by
        name). An unknown or unsupported layout raises ``UnsupportedLayoutError``.
        """
        return self._pick_io(self.supported_pairs, layout)

    def default_mha_io(self, layout: HostLayout | str) -> IOBackend:
        """``default_io`` for MHA host pools: the first of ``io_preference`` the layout runs."""
        return self._pick_io(self.supported_mha_pairs, layout)

    def _pick_io(
        self, pairs: Mapping[HostLayout, frozenset[IOBackend]], layout: HostLayout | str
    ) -> IOBackend:
        try:
            parsed = HostLayout.parse(layout, argument="layout")
        except ValueError as exc:
            raise UnsupportedLayoutError(str(exc)) from None
        if parsed not in pairs:
            supported = ", ".join(repr(x.value) for x in pairs)
            raise UnsupportedLayoutError(
                f"backend {self.name!r} does not build layout={parsed.value!r}; "
                f"its layouts: {supported}"
            )
        ios = pairs[parsed]
        ranked = [io for io in self.io_preference if io in ios]
        return (ranked or sorted(ios, key=lambda io: io.value))[0]

    def create_device_pool(self, **args: Unpack[MLAPoolArgs]) -> DeviceT:
        """An MLA (or DeepSeek-V3.2 DSA) device pool of this backend.

        ``size`` tokens (a whole number of ``page_size`` pages) per layer, plus
        the padding page, page 0: slots ``[0, size + page_size)``. Each token
        row is ``kv_lora_rank + qk_rope_head_dim`` elements of ``dtype``, or
        ``kv_cache_dim`` packed elements when given (e.g. ``torch.uint8``,
        656 for DSA's fp8 rows with scales). ``index_head_dim`` adds the DSA
        indexer cache for ``indexer_layer_ids`` (default every layer), with
        fp32 scales when ``with_index_k_scale``. ``device`` None: the
        backend's default device. Raises ``PoolSizeError`` (sizes, or a pool
        that does not fit), ``DeviceError`` (an unusable device).
        """
        return self._device_pool_class(**args)

    def create_mha_device_pool(self, **args: Unpack[MHAPoolArgs]) -> MHADevicePool:
        """An MHA/GQA device pool of this backend: K and V rows per token per layer.

        Slots as ``create_device_pool``'s (the padding page, page 0, included).
        A token's K row is ``(head_num, head_dim)`` elements of ``dtype`` and
        its V row ``(head_num, v_head_dim)`` (``v_head_dim`` None:
        ``head_dim``); for GQA ``head_num`` is the number of KV heads. Raises
        ``PoolSizeError``, ``DeviceError`` as ``create_device_pool``, and
        ``UnsupportedLayoutError`` on a backend that builds no MHA pools.
        """
        factory = self._mha_device_pool_class
        if factory is None:
            raise self._no_mha()
        return factory(**args)

    def _no_mha(self) -> UnsupportedLayoutError:
        return UnsupportedLayoutError(f"backend {self.name!r} builds no MHA pools")

    @overload
    def create_host_pool(
        self, device_pool: MHADevicePool, **options: Unpack[HostPoolOptions]
    ) -> MHAHostPool: ...

    @overload
    def create_host_pool(
        self, device_pool: MLADevicePool, **options: Unpack[HostPoolOptions]
    ) -> HostT: ...

    def create_host_pool(
        self, device_pool: MLADevicePool | MHADevicePool, **options: Unpack[HostPoolOptions]
    ) -> HostT | MHAHostPool:
        """A host pool of ``device_pool``'s kind (MHA or MLA), checked against its pairs.

        ``layout`` (a ``HostLayout`` or its string) must be one of this backend's
        ``supported_pairs`` (``supported_mha_pairs`` for an MHA pool), else
        ``UnsupportedLayoutError``. Its size is ``host_size_gb`` when positive,
        else ``device_pool.size * host_to_device_ratio`` tokens, in whole pages
        (``PoolSizeError`` for zero pages or more than the free host memory).
        ``pin_memory`` None pins when the device pool is on CUDA. ``io_backend``,
        when given, is checked against ``layout`` and becomes the pool's
        ``default_io_backend`` for transfers that omit theirs.
        """
        # An engine's own pool (e.g. SGLang's, whose ``device`` is a str) is
        # normalized here, at the boundary, so host pools see only the protocol.
        if is_mha_device_pool(device_pool):
            host = self._mha_host_pool_class
            if host is None:
                raise self._no_mha()
            return host(as_mha_device_pool(device_pool), **options, tuning=self.tuning)
        return self._host_pool_class(as_device_pool(device_pool), **options, tuning=self.tuning)


class TorchBackend(PoolBackend[PerLayerMLADevicePool, TokenRowHostPool]):
    """Backend ``"torch"``: always available."""

    name = "torch"
    #: Every layout runs only ``direct`` (torch copies, no kernels).
    io_preference = (IOBackend.DIRECT,)

    def __init__(self, *, tuning: CopyTuning | None = None) -> None:
        super().__init__(
            PerLayerMLADevicePool,
            TokenRowHostPool,
            tuning=tuning,
            mha_device_pool_class=PerLayerMHADevicePool,
            mha_host_pool_class=MHATokenHostPool,
        )


backend = TorchBackend()

if TYPE_CHECKING:
    from sgl_core.kv.protocols._kv_protocols import MLAHostPool
    from sgl_core.kv.protocols._protocols import Backend

    _backend: Backend = backend
    _device: MLADevicePool = backend.create_device_pool(
        size=1, page_size=1, dtype=torch.bfloat16, kv_lora_rank=1, qk_rope_head_dim=1, layer_num=1
    )
    _host: MLAHostPool = backend.create_host_pool(_device, layout="layer_first")
    _mha_device: MHADevicePool = backend.create_mha_device_pool(
        size=1, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1
    )
    _mha_host: MHAHostPool = backend.create_host_pool(_mha_device, layout="page_head")
