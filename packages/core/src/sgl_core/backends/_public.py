"""Public names report their public import path at run time (docs/design.md section 2,
"Public paths": who calls :func:`publish_names`, which name wins, annotations)."""

from __future__ import annotations

import inspect
import types
from collections.abc import Mapping

__all__ = ["publish_names"]


def _resolve_own_annotations(cls: type) -> None:
    """Replace ``cls``'s own string annotations by the objects they name in its module.

    Called before ``__module__`` changes: ``eval_str`` looks names up there.
    """
    own = inspect.get_annotations(cls)
    if not any(isinstance(v, str) for v in own.values()):
        return
    try:
        cls.__annotations__ = inspect.get_annotations(cls, eval_str=True)
    except (NameError, AttributeError, TypeError, SyntaxError):
        return  # a name only a TYPE_CHECKING block imports: unresolvable there as well


def publish_names(module_name: str, namespace: Mapping[str, object]) -> None:
    """Set ``__module__`` of each class and function in ``namespace['__all__']`` to
    ``module_name`` where it is now a private module of the same package."""
    package = module_name.split(".", 1)[0]
    for name in namespace["__all__"]:  # type: ignore[attr-defined]
        obj = namespace[name]
        if not isinstance(obj, (type, types.FunctionType)):
            continue
        parts = obj.__module__.split(".")
        if parts[0] != package or not any(part.startswith("_") for part in parts):
            continue
        if obj.__qualname__ != name:  # an alias: the public module lacks its own name
            continue
        if isinstance(obj, type):
            _resolve_own_annotations(obj)
        obj.__module__ = module_name
