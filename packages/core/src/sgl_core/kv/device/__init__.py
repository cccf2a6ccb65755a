"""Device pools: their geometry, device arguments, the DSA indexer cache,
and views of an engine's own device pool (foreign pools, paged indexer).

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
