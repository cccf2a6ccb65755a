"""Adapters that let serving engines drive sgl pools and stores unchanged.

* :mod:`sgl_core.integrations.sglang` — ``wrap_host_pool`` for SGLang's
  ``HiCacheController`` / ``L2TransferEngine`` (imports nothing from sglang).
* :mod:`sgl_core.integrations.sglang_storage` — an SGLang ``HiCacheStorage``
  backend over our L3 page stores, loaded through SGLang's ``dynamic`` option.

* :mod:`sgl_core.integrations.vllm` — ``SglOffloadingSpec``, vLLM 0.33's
  KV-offloading spec over our host pools (imports nothing from vllm).

See ``docs/sglang.md`` and ``docs/vllm.md``.
"""

__all__: list[str] = []
