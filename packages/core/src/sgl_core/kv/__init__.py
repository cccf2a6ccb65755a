"""The KV model: what a pool's rows are and the pools that hold them.

Here: the host-layout enums, shapes and row sizes, validation, host memory;
``protocols`` (what pools, backends and MoE methods satisfy), ``device``
(device pools, the device indexer, views of an engine's pool) and ``host``
(host pools, their slots, arguments and load memo).

Private: every module here is ``_*``. Engines use ``sgl_core``; device
packages use ``sgl_core.backend`` (the ``device-packages-use-public-core``
contract forbids this folder to them).
"""

__all__: list[str] = []
