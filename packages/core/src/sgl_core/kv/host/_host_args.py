"""Constructor arguments of a host pool: layout and io backend checks, sizing.

A layout or io backend the class has no mover for is ``UnsupportedLayoutError``
naming the supported pairs; sizing: docs/design.md section 5a, "Sizing and memory".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from sgl_core.errors import (
    ArgumentTypeError,
    PoolSizeError,
    UnsupportedLayoutError,
)
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._memory import available_host_bytes
from sgl_core.kv._spec import KVSpec
from sgl_core.kv.device._slot_geometry import PoolSizes
from sgl_core.kv.protocols._kv_protocols import DevicePoolGeometry
from sgl_core.transfer._transfer import MoverFactory

__all__ = ["HostArguments", "describe_pairs", "size_argument"]

ChoiceT = TypeVar("ChoiceT", HostLayout, IOBackend)

# Leave this much host memory to the rest of the process when sizing pools.
_MEMORY_HEADROOM = 1 << 30


def size_argument(name: str, value: object) -> float:
    """A finite, non-negative real number (``bool`` excluded), or a typed error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a real number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise PoolSizeError(f"{name} must be finite and not negative, got {value!r}")
    return number


def describe_pairs(pairs: Mapping[HostLayout, frozenset[IOBackend]]) -> str:
    return "; ".join(
        f"{layout.value}: {', '.join(sorted(io.value for io in ios))}"
        for layout, ios in pairs.items()
    )


class HostArguments(PoolSizes):
    """Layout, io backend and size checks; the class's ``movers`` and ``supported_pairs``."""

    #: Per host layout this class builds: each io backend it runs and its mover factory.
    movers: ClassVar[Mapping[HostLayout, Mapping[IOBackend, MoverFactory]]]
    #: Host layouts this class builds, each with the io backends it runs (from ``movers``).
    supported_pairs: ClassVar[Mapping[HostLayout, frozenset[IOBackend]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "supported_pairs" in cls.__dict__ and "movers" not in cls.__dict__:
            # A hand-written list could name pairs no mover runs: it is derived.
            raise TypeError(f"{cls.__name__} sets supported_pairs: declare movers instead")
        movers = getattr(cls, "movers", None)
        if movers is not None:
            cls.supported_pairs = {layout: frozenset(ios) for layout, ios in movers.items()}

    spec: KVSpec
    default_io_backend: IOBackend | None
    _layout: HostLayout

    def _given_io(self, io_backend: IOBackend | str | None) -> IOBackend | str:
        """``io_backend``, or the pool's default when None (``ArgumentTypeError`` if none)."""
        if io_backend is not None:
            return io_backend
        if self.default_io_backend is None:
            raise ArgumentTypeError(
                "io_backend is None and this host pool was created without an io_backend: "
                "pass one to the call or to create_host_pool"
            )
        return self.default_io_backend

    # ---------------------------------------------------------------- sizing
    def _check_layout(
        self, layout: HostLayout | str, io_backend: IOBackend | str | None
    ) -> HostLayout:
        pairs = type(self).supported_pairs
        parsed = self._parse(HostLayout, layout, "layout")
        if parsed not in pairs:
            raise UnsupportedLayoutError(
                f"layout={parsed.value!r} is not supported by {type(self).__name__}; "
                f"supported pairs: {describe_pairs(pairs)}"
            )
        if io_backend is not None:
            self._check_io_backend(parsed, io_backend)
        return parsed

    def _parse(self, kind: type[ChoiceT], value: object, argument: str) -> ChoiceT:
        try:
            return kind.parse(value, argument=argument)
        except ValueError as exc:
            pairs = describe_pairs(type(self).supported_pairs)
            raise UnsupportedLayoutError(f"{exc}; supported pairs: {pairs}") from None

    def _check_io_backend(self, layout: HostLayout, io_backend: IOBackend | str) -> IOBackend:
        pairs = type(self).supported_pairs
        parsed = self._parse(IOBackend, io_backend, "io_backend")
        if parsed not in pairs[layout]:
            raise UnsupportedLayoutError(
                f"io_backend={parsed.value!r} does not run layout={layout.value!r}; "
                f"supported pairs: {describe_pairs(pairs)}"
            )
        return parsed

    def _compute_size(
        self, device_pool: DevicePoolGeometry, host_to_device_ratio: float, host_size_gb: float
    ) -> int:
        per_token = self.spec.token_bytes  # host bytes of one token, every layer and component
        if host_size_gb > 0:
            tokens = int(host_size_gb * 1e9) // per_token
        else:
            tokens = int(device_pool.size * host_to_device_ratio)
        size = tokens // self._page_size * self._page_size
        if size <= 0:
            raise PoolSizeError(
                f"host pool would hold no whole page of {self._page_size} tokens "
                f"(host_size_gb={host_size_gb}, host_to_device_ratio={host_to_device_ratio})"
            )
        needed = size * per_token
        available = available_host_bytes()
        if available is not None and needed > available - _MEMORY_HEADROOM:
            raise PoolSizeError(
                f"host pool needs {needed / 1e9:.2f} GB but only {available / 1e9:.2f} GB "
                "of host memory is available (keeping 1 GiB headroom); "
                "lower host_size_gb or host_to_device_ratio"
            )
        return size
