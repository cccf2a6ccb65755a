from __future__ import annotations

import pytest

import sgl_core
from sgl_core import errors


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGL_BACKEND", raising=False)
    sgl_core.clear_backend_cache()
    yield
    sgl_core.clear_backend_cache()


def test_torch_is_always_there() -> None:
    assert "torch" in sgl_core.available_backends()
    backend = sgl_core.get_backend("torch")
    assert backend.name == "torch" and backend.is_available()
    assert isinstance(backend, sgl_core.Backend)


def test_default_on_a_cpu_machine_is_an_available_backend() -> None:
    backend = sgl_core.get_backend()
    assert backend.is_available()
    assert sgl_core.get_backend() is backend  # cached


def test_env_variable_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGL_BACKEND", "torch")
    assert sgl_core.get_backend().name == "torch"


def test_unknown_backend_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(errors.BackendNotFoundError, match="installed"):
        sgl_core.get_backend("tpu")
    monkeypatch.setenv("SGL_BACKEND", "tpu")
    with pytest.raises(LookupError):
        sgl_core.get_backend()
