"""Adapters that let serving engines drive sgl pools and stores unchanged: the
modules are in docs/design.md (section 2, module map); none imports its engine.
"""

__all__: list[str] = []
