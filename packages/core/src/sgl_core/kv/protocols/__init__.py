"""The typing protocols a pool, a backend or a MoE method satisfies, and what
the pool kinds share.

Private, as all of ``sgl_core.kv`` (see its docstring).
"""

__all__: list[str] = []
