"""What ``sgl_core`` promises to backend authors.

``sgl_core`` (its ``__all__``) is the API a serving engine uses. This module
is the interface a *device package* builds on: everything ``sgl_cuda`` and
``sgl_ascend`` use from core comes from here, and an import-linter contract
forbids them from importing any private ``sgl_core._*`` module. A name here
is kept stable like the engine API; private modules may change shape freely.

Groups:

* **discovery and bench hooks**: ``ENTRY_POINT_GROUP`` (where a backend
  registers), ``MOE_BENCH_GROUP``, ``MoEBenchCase``, ``MoEBenchFactory`` (a
  device package's MoE cases for ``sgl-bench moe``);
* **protocols and enums**: ``Backend``, ``MLADevicePool``, ``MLAHostPool``,
  ``HostLayout``, ``IOBackend``; the capabilities tools ask for instead of
  naming a device family: ``LayerViews`` (a host pool shows one layer as
  tensors) and ``EmulatedWithoutDevice`` (a backend that, without its device,
  runs only emulated);
* **the KV model**: ``KVSpec`` (a pool's rows as a list of ``Component``: name,
  heads, width, dtype, the layers that keep it), its presets ``mla_spec``
  and ``mha_spec`` (``KVKind``), the one source of sizes, page order and
  page-format identity; ``layout_facts`` (a token-row layout's ``LayoutFacts``:
  buffer shape, a row's view, page part) for movers that address host rows;
* **pool bases and geometry**: ``PoolBackend`` (backend plumbing),
  ``HostPoolBase`` (sizing, accounting, validation before any copy, from the
  spec) with its kind layers ``MLAHostPoolBase`` and ``MHAHostPoolBase``
  (how a kind's spec and engine accessors are read); ``TokenHostPool`` (the
  token-row host layouts over any spec) and its engine classes
  ``TokenRowHostPool`` (MLA) and ``MHATokenHostPool`` (MHA/GQA);
  ``TokenPages`` (the L3 page helpers of a pool whose ``_parts`` lie in a
  layout of the facts table, ``layout_facts`` / ``LayoutFacts``);
  ``PerLayerMLADevicePool``, ``MLAPoolGeometry``, ``MLAShape``,
  ``PerLayerMHADevicePool``, ``MHAPoolGeometry``, ``MHAShape``; every
  backend's device pools take their kind's engine constructor from
  ``MLADevicePoolBase`` / ``MHADevicePoolBase`` (``mla_pool_spec``: an MLA
  pool's spec with its indexer rows);
  ``is_mha_device_pool`` (how a device pool's kind is told, by attributes);
  ``DevicePoolGeometry`` and ``PoolShape`` are what ``HostPoolBase`` needs of
  either kind;
* **the mover seam**: a host pool validates a call into a ``Transfer`` and
  hands it to the ``Mover`` of its io backend (``mover.backup(transfer)``,
  ``mover.load(transfer, layer_id)``); ``HostPoolBase.movers`` declares,
  per layout, each io backend's ``MoverFactory`` (``supported_pairs`` is
  derived from it), called with the pool's ``HostSide`` (layout, geometry and
  one ``HostPart`` per component: the host buffers, never the pool);
  ``PlanCache`` keeps a mover's plan for the per-layer loads of one transfer;
  ``DirectMover`` is the ``direct`` mover of every token-row layout and kind;
* **validation helpers** (each raises a typed ``sgl_core.errors`` error):
  ``check_index_tensor``, ``check_index_device``, ``check_index_bounds``,
  ``check_layer_id``, ``check_backed``, ``check_routing`` (MoE top-k);
* **devices and memory**: ``parse_device``, ``usable_device``,
  ``page_aligned_zeros`` (host buffers on page boundaries, for
  ``O_DIRECT`` storage);
* **the copy kit** (the ``direct`` io building blocks): ``IndexRuns``,
  ``merge_runs``, ``byte_view``, ``widen_rows``; the
  direct-copy engine every direct mover uses (``RunSide``, ``copy_runs``,
  ``gather_rows``); and the one tuning object that picks a copy's path: ``CopyTuning`` with
  per-device presets (``tuning_for``; ``NEVER`` turns a path off; ``AUTO``: copy
  threads chosen by measurement, ``copy_calibration()`` says what was chosen and
  why, ``Calibrator`` / ``CopyChoice`` for other copy strategies, ``default_calibrator()``
  the process's one calibrator that ``copy_calibration()`` reads;
  ``shutdown_copy_threads`` stops the copy threads).

The conformance suite a backend runs against itself is
``sgl_core.testing.BackendConformanceSuite`` (it needs the ``testing``
extra, so it is not imported here).
"""

from __future__ import annotations

from sgl_core.backends._backend_base import PoolBackend
from sgl_core.backends._discovery import ENTRY_POINT_GROUP
from sgl_core.backends._public import publish_names
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._layouts import LayoutFacts, layout_facts
from sgl_core.kv._memory import page_aligned_zeros
from sgl_core.kv._shapes import MHAShape, MLAShape
from sgl_core.kv._spec import Component, KVKind, KVSpec, mha_spec, mla_spec
from sgl_core.kv._validation import (
    check_backed,
    check_index_bounds,
    check_index_device,
    check_index_tensor,
    check_layer_id,
    check_value_rows,
    check_value_tensor,
)
from sgl_core.kv.device._device_kinds import (
    MHADevicePoolBase,
    MHAPoolGeometry,
    MLADevicePoolBase,
    MLAPoolGeometry,
)
from sgl_core.kv.device._device_pool import PerLayerMHADevicePool, PerLayerMLADevicePool
from sgl_core.kv.device._device_rows import check_raw_rows
from sgl_core.kv.device._devices import parse_device, usable_device
from sgl_core.kv.device._indexer import IndexerConfig, IndexerRows, mla_pool_spec
from sgl_core.kv.host._host_kinds import MHAHostPoolBase, MLAHostPoolBase
from sgl_core.kv.host._host_pages import TokenPages
from sgl_core.kv.host._host_pool import HostPoolBase
from sgl_core.kv.host._token_host_pool import MHATokenHostPool, TokenHostPool, TokenRowHostPool
from sgl_core.kv.protocols._dsa_protocols import IndexerCache, KVRows
from sgl_core.kv.protocols._kv_protocols import (
    DevicePoolGeometry,
    MHADevicePool,
    MHAHostPool,
    MLADevicePool,
    MLAHostPool,
    PoolShape,
    is_mha_device_pool,
)
from sgl_core.kv.protocols._protocols import Backend, EmulatedWithoutDevice, LayerViews
from sgl_core.moe._bench_case import MOE_BENCH_GROUP, MoEBenchCase, MoEBenchFactory
from sgl_core.moe._moe import check_routing
from sgl_core.transfer._direct_mover import DirectMover
from sgl_core.transfer._transfer import (
    HostPart,
    HostSide,
    Mover,
    MoverFactory,
    PlanCache,
    Transfer,
)
from sgl_core.transfer.copy._calibrate import (
    Calibrator,
    CopyChoice,
    copy_calibration,
    default_calibrator,
)
from sgl_core.transfer.copy._copy import (
    IndexRuns,
    byte_view,
    merge_runs,
    shutdown_copy_threads,
    widen_rows,
)
from sgl_core.transfer.copy._engine import RunSide, copy_runs, gather_rows
from sgl_core.transfer.copy._steps import (
    Step,
    finish,
    gather_step,
    memmove_step,
    numpy_rows,
    slices_step,
)
from sgl_core.transfer.copy._tuning import AUTO, NEVER, CopyTuning, tuning_for

__all__ = [
    "AUTO",
    "Backend",
    "Calibrator",
    "Component",
    "CopyChoice",
    "CopyTuning",
    "DevicePoolGeometry",
    "DirectMover",
    "ENTRY_POINT_GROUP",
    "EmulatedWithoutDevice",
    "HostLayout",
    "HostPart",
    "HostPoolBase",
    "HostSide",
    "IOBackend",
    "IndexRuns",
    "IndexerCache",
    "IndexerConfig",
    "IndexerRows",
    "KVKind",
    "KVRows",
    "KVSpec",
    "LayerViews",
    "LayoutFacts",
    "MHADevicePool",
    "MHADevicePoolBase",
    "MHAHostPool",
    "MHAHostPoolBase",
    "MHAPoolGeometry",
    "MHAShape",
    "MHATokenHostPool",
    "MLADevicePool",
    "MLADevicePoolBase",
    "MLAHostPool",
    "MLAHostPoolBase",
    "MLAPoolGeometry",
    "MLAShape",
    "MOE_BENCH_GROUP",
    "MoEBenchCase",
    "MoEBenchFactory",
    "Mover",
    "MoverFactory",
    "NEVER",
    "PerLayerMHADevicePool",
    "PerLayerMLADevicePool",
    "PlanCache",
    "PoolBackend",
    "PoolShape",
    "RunSide",
    "Step",
    "TokenHostPool",
    "TokenPages",
    "TokenRowHostPool",
    "Transfer",
    "byte_view",
    "check_backed",
    "check_index_bounds",
    "check_index_device",
    "check_index_tensor",
    "check_layer_id",
    "check_raw_rows",
    "check_routing",
    "check_value_rows",
    "check_value_tensor",
    "copy_calibration",
    "copy_runs",
    "default_calibrator",
    "finish",
    "gather_rows",
    "gather_step",
    "is_mha_device_pool",
    "layout_facts",
    "memmove_step",
    "merge_runs",
    "mha_spec",
    "mla_pool_spec",
    "mla_spec",
    "numpy_rows",
    "page_aligned_zeros",
    "parse_device",
    "publish_names",
    "shutdown_copy_threads",
    "slices_step",
    "tuning_for",
    "usable_device",
    "widen_rows",
]

publish_names(__name__, globals())  # names first exported here report sgl_core.backend
