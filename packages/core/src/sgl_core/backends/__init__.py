"""Backend bases (``PoolBackend``), the portable torch backend, backend
discovery, and ``publish_names`` (public paths of public modules).

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
