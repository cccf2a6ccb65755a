from __future__ import annotations

import pytest

import sgl_core
import sgl_core.backend
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


def test_unknown_name_lists_installed_and_invents_no_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sgl_core.backends import _discovery

    monkeypatch.setattr(_discovery, "_entry_points", dict)  # only the embedded torch backend
    monkeypatch.setenv("SGL_BACKEND", "bogus")
    with pytest.raises(errors.BackendNotFoundError) as info:
        sgl_core.get_backend()
    message = str(info.value)
    assert "'bogus'" in message and "installed: torch" in message
    assert "sgl-bogus" not in message
    assert "cuda (sgl-cuda)" in message and "ascend (sgl-ascend)" in message
    with pytest.raises(errors.BackendNotFoundError, match="comes with the sgl-cuda distribution"):
        sgl_core.get_backend("cuda")


def test_default_io_is_the_fast_path_and_stable() -> None:
    from sgl_core import HostLayout, IOBackend

    torch_backend = sgl_core.get_backend("torch")
    for layout in torch_backend.supported_pairs:
        assert torch_backend.default_io(layout) is IOBackend.DIRECT
        assert torch_backend.default_io(layout.value.upper()) is IOBackend.DIRECT

    class TwoWays(sgl_core.TorchBackend):
        io_preference = sgl_core.backend.PoolBackend.io_preference  # kernel first

        @property
        def supported_pairs(self) -> dict[HostLayout, frozenset[IOBackend]]:
            both = frozenset({IOBackend.DIRECT, IOBackend.KERNEL})
            return {HostLayout.LAYER_FIRST: both, HostLayout.PAGE_FIRST: frozenset()}

    two = TwoWays()
    # kernel is preferred over direct, whatever the set's iteration order
    assert {two.default_io("layer_first") for _ in range(20)} == {IOBackend.KERNEL}
    two.io_preference = (IOBackend.DIRECT,)
    assert two.default_io("layer_first") is IOBackend.DIRECT
    two.io_preference = ()
    assert two.default_io("layer_first") is IOBackend.DIRECT  # not ranked: by name
    with pytest.raises(errors.UnsupportedLayoutError, match="page_first_kv_split"):
        torch_backend.default_io("page_first_kv_split")
    with pytest.raises(errors.UnsupportedLayoutError, match="diagonal"):
        torch_backend.default_io("diagonal")
