"""Adapters that let serving engines drive sgl pools and stores unchanged.

:mod:`sgl_core.integrations.sglang` and :mod:`sgl_core.integrations.sglang_storage`
(SGLang's host pools and ``HiCacheStorage``), :mod:`sgl_core.integrations.vllm`
(vLLM 0.33's KV-offloading spec and tier); none imports its engine. See
``docs/sglang.md`` and ``docs/vllm.md``.
"""

__all__: list[str] = []
