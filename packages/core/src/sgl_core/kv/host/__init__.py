"""Host pools: the generic base, the token-row pools, constructor checks,
slot accounting, the load memo and the indexer's host mirror.

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
