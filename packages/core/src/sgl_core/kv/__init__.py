"""The KV model: what a pool's rows are and the pools that hold them.

Modules: docs/design.md, module map. Private: every module here is ``_*``.
Engines use ``sgl_core``; device packages use ``sgl_core.backend`` (the
``device-packages-use-public-core`` contract forbids this folder to them).
"""

__all__: list[str] = []
