"""The ``sgl-bench`` console script (entry point :func:`sgl_core.cli.main.main`).

``rich`` and ``matplotlib`` (the ``bench`` extra) are optional and imported lazily.
"""

from __future__ import annotations

__all__: list[str] = []
