"""The typing protocols a pool, a backend or a MoE method satisfies, and what
the pool kinds share.

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
