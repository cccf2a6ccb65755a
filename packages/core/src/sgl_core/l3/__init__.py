"""L3 page stores: host-pool pages in a third tier beyond one machine's memory.

* :func:`page_keys` — chained SHA-256 keys, one per full page of tokens.
* :class:`PageStore` — the contract every store keeps (docs/design.md section 8).
* :class:`FilePageStore` — the embedded default, a local directory.
* :class:`MooncakePageStore` — the Mooncake distributed store (extra
  ``mooncake``: ``pip install './packages/core[mooncake]'``; ``mooncake`` is
  imported only when one is built).
* :class:`PageFormat` / :func:`page_format` — what a pool's page bytes mean;
  a pool of another format gets a miss (docs/design.md section 8).

Typical use::

    store = FilePageStore("/var/cache/sgl-l3", capacity_bytes=64 << 30)
    store.register_host_pool(host)
    keys = page_keys(token_ids, host.page_size, namespace="deepseek-v3/")
    hit = store.batch_exists(keys)
    store.batch_get(keys[:hit], host_indices)     # whole pages, one per key
"""

from __future__ import annotations

from sgl_core.backends._public import publish_names as _publish_names
from sgl_core.l3._file_store import FilePageStore
from sgl_core.l3._format import PageFormat, page_format
from sgl_core.l3._keys import page_keys
from sgl_core.l3._mooncake_store import MooncakeConfig, MooncakePageStore
from sgl_core.l3._protocol import (
    MooncakeSetupError,
    MooncakeUnavailableError,
    PageStore,
    PageStoreArgumentError,
    PageStoreError,
    PageStoreNotReadyError,
    PageStoreRootError,
    PageStoreRootInUseError,
    PageStoreStats,
)

__all__ = [
    "FilePageStore",
    "MooncakeConfig",
    "MooncakePageStore",
    "MooncakeSetupError",
    "MooncakeUnavailableError",
    "PageFormat",
    "PageStore",
    "PageStoreArgumentError",
    "PageStoreError",
    "PageStoreNotReadyError",
    "PageStoreRootError",
    "PageStoreRootInUseError",
    "PageStoreStats",
    "page_format",
    "page_keys",
]

_publish_names(__name__, globals())  # sgl_core.l3.PageStore, not sgl_core.l3._protocol...
del _publish_names
