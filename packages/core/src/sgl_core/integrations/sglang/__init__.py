"""Our host pools and L3 stores as SGLang 0.5.23's HiCache pieces (the storage backend
is in :mod:`sgl_core.integrations.sglang_storage`); what each piece is for, the
semantics kept from SGLang and the deliberate differences: docs/sglang.md. This
package imports nothing from ``sglang``.
"""

from __future__ import annotations

from sgl_core.backends._public import publish_names as _publish_names
from sgl_core.integrations.sglang._builder import indexer_host_pool_builder, kv_host_pool_builder
from sgl_core.integrations.sglang._host import SGLangHostPool, wrap_host_pool
from sgl_core.integrations.sglang._indexer_pool import SGLangIndexerHostPool
from sgl_core.kv.device._engine_views import as_device_pool, as_mha_device_pool

__all__ = [
    "SGLangHostPool",
    "SGLangIndexerHostPool",
    "as_device_pool",
    "as_mha_device_pool",
    "indexer_host_pool_builder",
    "kv_host_pool_builder",
    "wrap_host_pool",
]

_publish_names(__name__, globals())  # sgl_core.integrations.sglang.wrap_host_pool, ...
del _publish_names
