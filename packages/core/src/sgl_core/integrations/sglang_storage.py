"""An SGLang (0.5.23) HiCache storage backend over our L3 page stores.

Loaded by SGLang's ``dynamic`` backend (docs/sglang.md). Importing this
module registers :class:`SGLangPageStorage` as a virtual ``HiCacheStorage``
when sglang is importable (its factory accepts only subclasses); without
sglang the class works on its own.
"""

from __future__ import annotations

import importlib
import importlib.util

from sgl_core.backends._public import publish_names as _publish_names
from sgl_core.integrations.sglang._storage import SGLangPageStorage
from sgl_core.integrations.sglang._storage_config import rank_root_name, shard_key_parts

__all__ = ["SGLangPageStorage", "rank_root_name", "register_with_sglang", "shard_key_parts"]


def register_with_sglang() -> bool:
    """Make :class:`SGLangPageStorage` a (virtual) ``HiCacheStorage``; False without sglang."""
    try:
        if importlib.util.find_spec("sglang") is None:
            return False
        module = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:  # an unrelated or partial "sglang" on the path
        return False
    module.HiCacheStorage.register(SGLangPageStorage)
    return True


register_with_sglang()
_publish_names(__name__, globals())  # SGLangPageStorage reports this module
del _publish_names
