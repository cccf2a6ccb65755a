"""The MHA half of ``PoolBackend``: MHA pairs, their default io, and the MHA pool factories.

A backend builds MHA pools when it is given an MHA device-pool factory and
an MHA host-pool class (``PoolBackend(..., mha_device_pool_class=...,
mha_host_pool_class=...)``; the torch backend passes
``PerLayerMHADevicePool`` and ``MHATokenHostPool``). Without them
``supported_mha_pairs`` is empty and both factories raise
``UnsupportedLayoutError``, so tools and the conformance suite skip MHA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from sgl_core.errors import UnsupportedLayoutError
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv.device._engine_views import as_mha_device_pool
from sgl_core.kv.host._host_kinds import MHAHostPoolBase
from sgl_core.kv.protocols._kv_protocols import MHADevicePool, MHAHostPool
from sgl_core.transfer.copy._tuning import CopyTuning

__all__ = ["MHABackendMixin"]


class MHABackendMixin:
    """``supported_mha_pairs``, ``default_mha_io``, ``create_mha_device_pool`` of a backend."""

    name: str
    tuning: CopyTuning | None
    _mha_device_pool_class: Callable[..., MHADevicePool] | None
    _mha_host_pool_class: type[MHAHostPoolBase] | None

    def _pick_io(
        self, pairs: Mapping[HostLayout, frozenset[IOBackend]], layout: HostLayout | str
    ) -> IOBackend:
        raise NotImplementedError

    @property
    def supported_mha_pairs(self) -> Mapping[HostLayout, frozenset[IOBackend]]:
        """Host layouts this backend builds for MHA pools, each with its io backends.

        Derived from the MHA host class's ``movers`` (as ``supported_pairs``
        is for MLA); empty when the backend has no MHA pools.
        """
        host = self._mha_host_pool_class
        return {} if host is None else host.supported_pairs

    def default_mha_io(self, layout: HostLayout | str) -> IOBackend:
        """``default_io`` for MHA host pools: the first of ``io_preference`` the layout runs."""
        return self._pick_io(self.supported_mha_pairs, layout)

    def _no_mha(self) -> UnsupportedLayoutError:
        return UnsupportedLayoutError(f"backend {self.name!r} builds no MHA pools")

    def create_mha_device_pool(
        self,
        *,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device | None = None,
        v_head_dim: int | None = None,
    ) -> MHADevicePool:
        """An MHA/GQA device pool of this backend: K and V rows per token per layer.

        ``size`` tokens (a whole number of ``page_size`` pages) per layer, plus
        the padding page, page 0: slots ``[0, size + page_size)``. A token's K
        row is ``(head_num, head_dim)`` elements of ``dtype`` and its V row
        ``(head_num, v_head_dim)`` (``v_head_dim`` None: ``head_dim``); for GQA
        ``head_num`` is the number of KV heads. ``device`` None: the backend's
        default device. Raises ``PoolSizeError`` (sizes, or a pool that does
        not fit), ``DeviceError`` (an unusable device), and
        ``UnsupportedLayoutError`` on a backend that builds no MHA pools.
        """
        factory = self._mha_device_pool_class
        if factory is None:
            raise self._no_mha()
        return factory(
            size=size,
            page_size=page_size,
            dtype=dtype,
            head_num=head_num,
            head_dim=head_dim,
            layer_num=layer_num,
            device=device,
            v_head_dim=v_head_dim,
        )

    def _create_mha_host_pool(self, device_pool: Any, **args: Any) -> MHAHostPool:
        host = self._mha_host_pool_class
        if host is None:
            raise self._no_mha()
        # An engine's own pool (SGLang's: ``device`` a str) is normalized here.
        pool: MHAHostPool = host(as_mha_device_pool(device_pool), **args, tuning=self.tuning)
        return pool
