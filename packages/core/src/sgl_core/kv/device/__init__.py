"""Device pools: their geometry, device arguments, the DSA indexer cache,
and views of an engine's own device pool (foreign pools, paged indexer).

Private, as all of ``sgl_core.kv`` (see its docstring).
"""

__all__: list[str] = []
