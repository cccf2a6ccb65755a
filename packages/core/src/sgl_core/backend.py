"""What ``sgl_core`` promises to backend authors (docs/design.md section 2).

Everything ``sgl_cuda`` and ``sgl_ascend`` use from core comes from here (an
import-linter contract forbids them any private ``sgl_core._*`` module); a
name here is kept stable like the engine API. The conformance suite a backend
runs is ``sgl_core.testing.BackendConformanceSuite`` (``testing`` extra).
"""

from __future__ import annotations

from sgl_core.backends._backend_base import PoolBackend
from sgl_core.backends._discovery import ENTRY_POINT_GROUP
from sgl_core.backends._public import publish_names
from sgl_core.kv._enums import HostLayout, IOBackend
from sgl_core.kv._layouts import LayoutFacts, layout_facts
from sgl_core.kv._memory import cpu_zeros, page_aligned_zeros
from sgl_core.kv._spec import Component, KVKind, KVSpec, MHAShape, MLAShape, mha_spec, mla_spec
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
from sgl_core.kv.device._indexer import IndexerConfig, IndexerRows, mla_pool_spec
from sgl_core.kv.device._slot_geometry import parse_device, usable_device
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
from sgl_core.transfer._direct_load import backup_path, slices_may_copy
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
from sgl_core.transfer.copy._copy import byte_view, shutdown_copy_threads, widen_rows
from sgl_core.transfer.copy._engine import RunSide, copy_runs, gather_rows
from sgl_core.transfer.copy._pieces import IndexRuns, merge_runs, page_numbers
from sgl_core.transfer.copy._steps import (
    Step,
    finish,
    gather_step,
    memmove_step,
    numpy_rows,
    slices_shape,
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
    "backup_path",
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
    "cpu_zeros",
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
    "page_numbers",
    "parse_device",
    "publish_names",
    "shutdown_copy_threads",
    "slices_may_copy",
    "slices_shape",
    "slices_step",
    "tuning_for",
    "usable_device",
    "widen_rows",
]

publish_names(__name__, globals())  # names first exported here report sgl_core.backend
