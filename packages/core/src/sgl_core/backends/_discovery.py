"""Backend discovery through the ``sgl.backends`` entry-point group: resolution order,
lazy loading and caching are docs/design.md section 4."""

from __future__ import annotations

import logging
import os
import threading
from importlib.metadata import EntryPoint, entry_points

from sgl_core.backends._backend_base import backend as _torch_backend
from sgl_core.errors import AmbiguousBackendError, BackendNotFoundError, BackendUnavailableError
from sgl_core.kv.protocols._protocols import Backend

__all__ = ["ENTRY_POINT_GROUP", "available_backends", "clear_backend_cache", "get_backend"]

ENTRY_POINT_GROUP = "sgl.backends"
# Backends this project publishes, and the distribution that registers each.
KNOWN_BACKENDS = {"torch": "sgl-core", "cuda": "sgl-cuda", "ascend": "sgl-ascend"}
_lock = threading.RLock()
_log = logging.getLogger("sgl_core")
_loaded: dict[str, Backend] = {}
_auto: dict[str, Backend] = {}


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> list[str]:
    """Names of installed backends (``"torch"`` always), without importing them."""
    return sorted({"torch", *_entry_points()})


def _not_found(name: str) -> str:
    installed = available_backends()
    message = f"no sgl backend named {name!r} is installed; installed: {', '.join(installed)}"
    dist = KNOWN_BACKENDS.get(name)
    if dist is not None:
        return f"{message} (backend {name!r} comes with the {dist} distribution)"
    known = ", ".join(f"{n} ({d})" for n, d in KNOWN_BACKENDS.items() if n not in installed)
    return message + (f"; not installed: {known}" if known else "")


def _load(name: str) -> Backend:
    if name in _loaded:
        return _loaded[name]
    if name == "torch":
        loaded: Backend = _torch_backend
    else:
        found = _entry_points().get(name)
        if found is None:
            raise BackendNotFoundError(_not_found(name))
        try:
            obj = found.load()
        except Exception as exc:
            raise BackendUnavailableError(f"backend {name!r} failed to import: {exc}") from exc
        if not isinstance(obj, Backend):
            raise BackendUnavailableError(
                f"entry point {found.value!r} of backend {name!r} is not an sgl_core.Backend"
            )
        loaded = obj
    _loaded[name] = loaded
    return loaded


def _usable(name: str) -> bool:
    try:
        return _load(name).is_available()
    except BackendUnavailableError as exc:
        _log.warning("skipping sgl backend %r: %s", name, exc)
        return False


def get_backend(name: str | None = None) -> Backend:
    """Return the backend named ``name`` (``"torch"``, ``"cuda"``, ``"ascend"``) or resolve one.

    An explicitly named backend is returned even when ``is_available()`` is
    False (e.g. a device backend run on CPU tensors for development); its own
    constructors then decide what works.
    """
    with _lock:
        if name is None:
            name = os.environ.get("SGL_BACKEND", "").strip() or None
        if name is not None:
            return _load(name.strip().lower())
        if "auto" not in _auto:
            usable = [n for n in sorted(_entry_points()) if _usable(n)]
            if len(usable) > 1:
                raise AmbiguousBackendError(
                    f"several device backends are available here ({usable}); "
                    "set SGL_BACKEND or pass get_backend(name=...)"
                )
            _auto["auto"] = _load(usable[0]) if usable else _torch_backend
        return _auto["auto"]


def clear_backend_cache() -> None:
    """Forget resolved backends (for tests and after changing ``SGL_BACKEND``)."""
    with _lock:
        _loaded.clear()
        _auto.clear()
