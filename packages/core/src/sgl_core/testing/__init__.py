"""Conformance suite and helpers for sgl backends (needs pytest and hypothesis).

Install with ``pip install './packages/core[testing]'`` (from the repository);
see :class:`BackendConformanceSuite` and docs/design.md, section 4.
"""

from __future__ import annotations

from sgl_core.backends._public import publish_names as _publish_names
from sgl_core.testing._helpers import (
    device_rows,
    fill_device_random,
    host_bytes,
    page_indices,
    random_bits,
    read_memory,
    same_bytes,
    snapshot,
)
from sgl_core.testing._kinds import KINDS, KindCase
from sgl_core.testing._suite import BackendConformanceSuite

__all__ = [
    "BackendConformanceSuite",
    "KINDS",
    "KindCase",
    "device_rows",
    "fill_device_random",
    "host_bytes",
    "page_indices",
    "random_bits",
    "read_memory",
    "same_bytes",
    "snapshot",
]

_publish_names(__name__, globals())  # sgl_core.testing.BackendConformanceSuite in reports
del _publish_names
