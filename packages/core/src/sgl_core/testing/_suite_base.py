"""Hooks and helpers every conformance check shares (a base of ``BackendConformanceSuite``).

Its ``kind`` x ``pair`` parameters (docs/design.md, section 4) are computed at
collection from ``backend_name``'s backend.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from sgl_core import Backend, MHADevicePool, MLADevicePool, get_backend
from sgl_core.testing._helpers import (
    device_bytes,
    device_rows,
    fill_device_random,
    host_bytes,
    page_indices,
    slot_count,
)
from sgl_core.testing._kinds import KINDS, DevicePool, HostPool, KindCase, Pair, sorted_pairs

__all__ = ["SuiteBase"]


_ROW_OPTIONS = ("kv_cache_dim", "index_head_dim", "indexer_layer_ids", "with_index_k_scale")
#: The class attributes each kind's device pools are built with (then the kind's options).
_MLA_ARGS = ("dtype", "kv_lora_rank", "qk_rope_head_dim", "layer_num")
_MHA_ARGS = ("dtype", "head_num", "head_dim", "layer_num")


def _pair_id(pair: Pair) -> str:
    return f"{pair[0].value}-{pair[1].value}"


class SuiteBase:
    """Class attributes a backend may override, the pool hooks, and shared helpers."""

    backend_name: ClassVar[str] = "torch"
    #: The KV kinds every kind-parametrized check runs (MHA ones need MHA pairs).
    kinds: ClassVar[tuple[KindCase, ...]] = KINDS
    dtype: ClassVar[torch.dtype] = torch.bfloat16
    layer_num: ClassVar[int] = 3
    kv_lora_rank: ClassVar[int] = 16
    qk_rope_head_dim: ClassVar[int] = 8
    head_num: ClassVar[int] = 2
    head_dim: ClassVar[int] = 16
    #: The V width of the narrow-V MHA kind (the other MHA kind: ``head_dim``).
    mha_v_head_dim: ClassVar[int] = 8
    device_pages: ClassVar[int] = 6
    page_sizes: ClassVar[tuple[int, ...]] = (1, 16, 64)
    #: False where transfers cannot run from two threads (e.g. Triton's interpreter).
    concurrent_transfers: ClassVar[bool] = True

    # ----------------------------------------------------------- parameters
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        # The row options were class attributes once; set now, they would do nothing.
        stale = [n for n in _ROW_OPTIONS if hasattr(self, n)]
        if stale:
            raise TypeError(f"{type(self).__name__} sets {stale}: add a KindCase to kinds instead")
        names = metafunc.fixturenames
        if "kind" not in names and "pair" not in names:
            return
        backend = get_backend(self.backend_name)
        kinds = [k for k in self.kinds if k.pairs(backend)]
        if "kind" not in names:  # every MLA pair
            pairs = list(sorted_pairs(backend.supported_pairs))
            metafunc.parametrize("pair", pairs, ids=[_pair_id(p) for p in pairs])
        elif "pair" not in names:
            metafunc.parametrize("kind", kinds, ids=[k.name for k in kinds])
        else:
            cases = [
                pytest.param(kind, pair, id=f"{kind.name}-{_pair_id(pair)}")
                for kind in kinds
                for pair in sorted_pairs(kind.pairs(backend))
            ]
            metafunc.parametrize(("kind", "pair"), cases)

    # ----------------------------------------------------------------- hooks
    @pytest.fixture
    def backend(self) -> Backend:
        return get_backend(self.backend_name)

    def device_pool_args(self, **options: Any) -> dict[str, Any]:
        """``create_device_pool``'s arguments but the sizes: this class's, then ``options``."""
        return {**{name: getattr(self, name) for name in _MLA_ARGS}, **options}

    def make_device_pool(
        self, backend: Backend, *, page_size: int, pages: int, **options: Any
    ) -> MLADevicePool:
        """Build a small MLA device pool; override to pass backend-specific options.

        ``options`` (a kind's row options, another dtype) override
        ``device_pool_args``; pass them on.
        """
        args = self.device_pool_args(**options)
        return backend.create_device_pool(size=pages * page_size, page_size=page_size, **args)

    def make_mha_device_pool(
        self, backend: Backend, *, page_size: int, pages: int, **options: Any
    ) -> MHADevicePool:
        """Build a small MHA device pool; override to pass backend-specific options."""
        args = {**{name: getattr(self, name) for name in _MHA_ARGS}, **options}
        return backend.create_mha_device_pool(size=pages * page_size, page_size=page_size, **args)

    # --------------------------------------------------------------- helpers
    def mla_pool(
        self, backend: Backend, *, seed: int | None = None, **options: Any
    ) -> MLADevicePool:
        """An MLA pool of this class's rows (``options`` over them), pages of 16 tokens.

        Built by ``backend`` itself, whatever ``make_device_pool`` does; filled
        with random bits when ``seed`` is given.
        """
        args = self.device_pool_args(**options)
        dev = backend.create_device_pool(size=self.device_pages * 16, page_size=16, **args)
        if seed is not None:
            fill_device_random(dev, seed)
        return dev

    def make_pool(
        self,
        backend: Backend,
        kind: KindCase,
        *,
        page_size: int = 16,
        pages: int | None = None,
        seed: int | None = None,
        **options: Any,
    ) -> DevicePool:
        """A device pool of ``kind`` (``options`` override the kind's, e.g. ``dtype``).

        Filled with random bits when ``seed`` is given.
        """
        count = self.device_pages if pages is None else pages
        if kind.dtype is not None:
            options.setdefault("dtype", kind.dtype)
        if kind.mha and kind.narrow_v:
            options.setdefault("v_head_dim", self.mha_v_head_dim)
        make = self.make_mha_device_pool if kind.mha else self.make_device_pool
        options = {**kind.options(), **options}  # (no options for MHA kinds)
        dev: DevicePool = make(backend, page_size=page_size, pages=count, **options)
        if seed is not None:
            fill_device_random(dev, seed)
        return dev

    def build(
        self,
        backend: Backend,
        kind: KindCase,
        layout: Any,
        page_size: int,
        seed: int = 0,
        **options: Any,
    ) -> tuple[DevicePool, HostPool]:
        """A random-filled device pool of ``kind`` and a host pool twice its size."""
        dev = self.make_pool(backend, kind, page_size=page_size, seed=seed, **options)
        host = backend.create_host_pool(dev, layout=layout, host_to_device_ratio=2.0)
        return dev, host

    def round_trip(
        self,
        backend: Backend,
        kind: KindCase,
        pair: Pair,
        page_size: int,
        dev_pages: list[int],
        host_pages: list[int],
        *,
        unit: int | None = None,
        layers: list[int] | None = None,
        **options: Any,
    ) -> None:
        """Backup pages, reload them per layer into a second pool, compare bytes.

        The pages are of ``unit`` tokens (default ``page_size``; 1: single
        tokens); ``layers`` are the layers loaded (default every one). Host
        pages, device slots and layers outside the transfer must keep their bytes.
        """
        layout, io = pair
        src, host = self.build(backend, kind, layout, page_size, seed=1, **options)
        dst = self.make_pool(backend, kind, page_size=page_size, **options)
        fill_device_random(dst, 2)
        d_idx = page_indices(dev_pages, page_size if unit is None else unit)
        h_idx = page_indices(host_pages, page_size if unit is None else unit)
        what = f"{kind.name} {layout.value}/{io.value} page_size={page_size}"
        before_host = host_bytes(host)
        host.backup_from_device_all_layer(src, h_idx, d_idx, io)
        after_host = host_bytes(host)
        touched = set((h_idx // page_size).tolist())
        for page in range(host.size // page_size):
            if page not in touched:
                assert torch.equal(before_host[page], after_host[page]), f"{what}: host {page}"
        untouched = torch.ones(slot_count(dst), dtype=torch.bool)
        untouched[d_idx] = False
        dst_before = device_bytes(dst)
        loaded = list(range(self.layer_num)) if layers is None else layers
        for layer in loaded:
            host.load_to_device_per_layer(dst, h_idx, d_idx, layer, io)
        for layer, now in enumerate(device_bytes(dst)):
            if layer not in loaded:
                assert torch.equal(now, dst_before[layer]), f"{what}: layer {layer} touched"
                continue
            expected = device_rows(src, layer, d_idx)
            assert torch.equal(expected, device_rows(dst, layer, d_idx)), f"{what}: layer {layer}"
            assert torch.equal(now[untouched], dst_before[layer][untouched]), f"{what}: slot"
