"""Host pools: the generic base, the token-row pools, constructor checks,
slot accounting, the load memo and the indexer's host mirror.

Private, as all of ``sgl_core.kv`` (see its docstring).
"""

__all__: list[str] = []
