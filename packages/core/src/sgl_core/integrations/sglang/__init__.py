"""Our host pools and L3 stores as SGLang 0.5.23's HiCache pieces.

* :func:`wrap_host_pool` — any of our host pools (MLA, MHA/GQA; torch, cuda,
  ascend backends) as SGLang's ``mem_pool_host`` or as the host pool of a
  ``HostPoolGroup`` entry (``HybridCacheController``).
* :func:`kv_host_pool_builder` — a drop-in for SGLang's
  ``hybrid_pool_assembler.build_kv_host_pool``, so the server's default stack
  (``UnifiedRadixCache.init_hicache`` -> ``build_kv_only_stack``) builds our
  pools.
* :func:`indexer_host_pool_builder` — a drop-in for SGLang's
  ``DSAIndexerHostPoolBuilder``, so its DeepSeek-V3.2 stack (``_DsaStrategy``)
  builds our ``INDEXER`` entry (:class:`SGLangIndexerHostPool`) beside our KV root.
* :mod:`sgl_core.integrations.sglang_storage` — the storage backend.

This package imports nothing from ``sglang``. Semantics kept from SGLang, and
the deliberate differences, are listed in ``docs/sglang.md``.
"""

from __future__ import annotations

from sgl_core.backends._public import publish_names as _publish_names
from sgl_core.integrations.sglang._builder import kv_host_pool_builder
from sgl_core.integrations.sglang._host import SGLangHostPool, wrap_host_pool
from sgl_core.integrations.sglang._indexer_builder import indexer_host_pool_builder
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
