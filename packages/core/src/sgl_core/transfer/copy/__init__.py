"""The copy kit: runs, byte views and pieces, batched and by-address copies,
the direct-copy engine, ``CopyTuning`` and the calibrated copy threads.

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
