"""Structural contracts between serving engines, sgl_core and backends: backends,
MoE methods and capabilities (the KV pools' own: ``sgl_core.kv.protocols._kv_protocols``).

Backend authors: implement these Protocols (no inheritance needed) and add a
static conformance line to your module, e.g.::

    if TYPE_CHECKING:
        _backend: Backend = MyBackend()

then run ``sgl_core.testing`` against your backend. Engines type their code
against these Protocols only, never against a backend's concrete classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, overload, runtime_checkable

import torch
from typing_extensions import Unpack

from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.protocols._kv_protocols import (
    HostPoolOptions,
    MHADevicePool,
    MHAHostPool,
    MHAPoolArgs,
    MLADevicePool,
    MLAHostPool,
    MLAPoolArgs,
)

__all__ = ["Backend", "EmulatedWithoutDevice", "LayerViews", "MoEExperts", "MoEMethod"]


@runtime_checkable
class LayerViews(Protocol):
    """A host pool that shows one layer of a transfer as tensors (benchmarks, checks).

    ``layer_views(device_pool, layer_id)`` returns, per component of the
    layer, ``(device_rows, host_pages)``: ``device_rows (slots, dim)``
    addressed by device token index and ``host_pages (pages, page_size, dim)``
    addressed by ``(host_index // page_size, host_index % page_size)``; both
    are views of the pools' own memory, so copies between them move real bytes.
    """

    def layer_views(
        self, device_pool: MLADevicePool, layer_id: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]: ...


@runtime_checkable
class EmulatedWithoutDevice(Protocol):
    """A backend that, without its device, runs only in an emulator (correctness only).

    Tools that time transfers leave such a backend out of "every backend"
    runs, and turn the emulator on when it is named explicitly.
    """

    def missing_device(self) -> str:
        """Why it is not available here, e.g. ``"no XYZ device here"``."""
        ...

    def start_emulation(self) -> str:
        """Make this process run the backend emulated; a note saying how.

        Raises ``BackendUnavailableError`` when it is too late in this process.
        """
        ...


@runtime_checkable
class Backend(Protocol):
    """A device backend, registered under entry-point group ``sgl.backends``.

    MLA and MHA pools come from the same backend: ``create_device_pool`` /
    ``create_mha_device_pool``, and ``create_host_pool`` builds the host pool
    of the device pool's kind. A backend without MHA pools has empty
    ``supported_mha_pairs`` (``PoolBackend``'s default).
    """

    @property
    def name(self) -> str: ...

    @property
    def supported_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        """Host layouts this backend builds for MLA pools, each with its io backends."""
        ...

    @property
    def supported_mha_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        """Host layouts this backend builds for MHA pools (empty: no MHA support)."""
        ...

    def is_available(self) -> bool:
        """True when this backend's device and runtime are usable here."""
        ...

    def default_io(self, layout: HostLayout | str) -> IOBackend:
        """The io backend to use for ``layout`` (its fastest; deterministic).

        One of ``supported_pairs[layout]``; an unsupported layout raises
        ``sgl_core.errors.UnsupportedLayoutError``.
        """
        ...

    def default_mha_io(self, layout: HostLayout | str) -> IOBackend:
        """``default_io`` for MHA host pools: one of ``supported_mha_pairs[layout]``."""
        ...

    def create_device_pool(self, **args: Unpack[MLAPoolArgs]) -> MLADevicePool:
        """A device pool; ``kv_cache_dim`` for packed rows, ``index_head_dim`` for an indexer."""
        ...

    def create_mha_device_pool(self, **args: Unpack[MHAPoolArgs]) -> MHADevicePool:
        """An MHA/GQA device pool; ``v_head_dim`` defaults to ``head_dim``."""
        ...

    @overload
    def create_host_pool(
        self, device_pool: MHADevicePool, **options: Unpack[HostPoolOptions]
    ) -> MHAHostPool: ...

    @overload
    def create_host_pool(
        self, device_pool: MLADevicePool, **options: Unpack[HostPoolOptions]
    ) -> MLAHostPool:
        """Build a host pool of the device pool's kind; an unsupported layout is rejected here."""
        ...


class MoEMethod(Protocol):
    """A routed-experts compute method (a quant method of a fused MoE layer).

    ``fuses_routed_scale_and_shared_add`` is True when ``apply`` does *not*
    multiply its output by ``routed_scaling_factor``: the combine then folds
    the scale into the shared-expert add. Declare it on the class.
    """

    fuses_routed_scale_and_shared_add: ClassVar[bool]

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Routed-experts output ``(tokens, hidden)`` for ``x (tokens, hidden)``."""
        ...


class MoEExperts(Protocol):
    """The experts module the combine receives: it holds a ``quant_method``."""

    @property
    def quant_method(self) -> object: ...
