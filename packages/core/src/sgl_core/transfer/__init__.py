"""Moving rows between a host and a device pool: the ``Transfer``/``Mover``
seam, the movers, and the copy kit (``copy``).

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
