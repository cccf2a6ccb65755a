"""Adapters that let serving engines drive sgl pools and stores unchanged.

* :mod:`sgl_core.integrations.sglang` — ``wrap_host_pool`` for SGLang's
  ``HiCacheController`` / ``L2TransferEngine`` (imports nothing from sglang).
* :mod:`sgl_core.integrations.sglang_storage` — an SGLang ``HiCacheStorage``
  backend over our L3 page stores, loaded through SGLang's ``dynamic`` option.

See ``docs/sglang.md``.
"""

__all__: list[str] = []
