"""MoE combine, the reference torch MoE method and the MoE bench-case hooks.

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
