"""The per-layer load memo's policy (``sgl_core.kv.host._load_memo``), checked on CPU.

Indices on an accelerator must never be read back by the memo (a host-device
synchronization per layer); the tests simulate such indices by switching off
``reads_contents`` and by making ``torch.equal`` fail if it is called.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core import errors
from sgl_core.kv.host._host_kinds import MLAHostPoolBase
from sgl_core.testing import fill_device_random, page_indices

PS = 16
LAYERS = 4


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = MLAHostPoolBase._check_transfer

    def counting(self: MLAHostPoolBase, *args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(MLAHostPoolBase, "_check_transfer", counting)
    return calls


@pytest.fixture
def accelerator_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat CPU index tensors as device-resident: no value may be read on a repeat call."""
    try:
        memo = importlib.import_module("sgl_core.kv.host._load_memo")
    except ImportError:  # a build without the policy switch: torch.equal below still trips
        memo = None
    if memo is not None:
        monkeypatch.setattr(memo, "reads_contents", lambda device: False)
    real_equal = torch.equal

    def no_content_reads(a: torch.Tensor, b: torch.Tensor) -> bool:
        if a.dtype == torch.int64 and a.dim() == 1:
            raise AssertionError("the memo compared index values (a device sync on a GPU)")
        return real_equal(a, b)

    monkeypatch.setattr(torch, "equal", no_content_reads)


def pools() -> tuple[sgl_core.backend.PerLayerMLADevicePool, sgl_core.backend.TokenRowHostPool]:
    backend = sgl_core.TorchBackend()
    dev = backend.create_device_pool(
        size=6 * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=LAYERS,
    )
    fill_device_random(dev, 0)
    return dev, backend.create_host_pool(dev, layout="layer_first")


@pytest.mark.usefixtures("accelerator_policy")
def test_repeat_calls_validate_once_without_reading_indices(validations: list[int]) -> None:
    dev, host = pools()
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    for layer in range(LAYERS):
        host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "direct")
    assert len(validations) == 1


@pytest.mark.usefixtures("accelerator_policy")
def test_in_place_write_is_noticed_by_its_version(validations: list[int]) -> None:
    dev, host = pools()
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    d_idx[:PS] += dev.size + dev.page_size  # a torch write: bumps _version
    with pytest.raises(errors.IndexOutOfRangeError):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    assert len(validations) == 2
    d_idx[:PS] -= dev.size + dev.page_size
    host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    host.load_to_device_per_layer(dev, h_idx, d_idx, 2, "direct")
    assert len(validations) == 3


@pytest.mark.usefixtures("accelerator_policy")
def test_equal_but_new_tensors_are_validated_again(validations: list[int]) -> None:
    dev, host = pools()
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    host.load_to_device_per_layer(dev, h_idx.clone(), d_idx, 1, "direct")
    host.load_to_device_per_layer(dev, h_idx, d_idx.clone(), 2, "direct")
    assert len(validations) == 3


@pytest.mark.usefixtures("accelerator_policy")
def test_index_tensor_set_to_other_storage_is_validated_again(validations: list[int]) -> None:
    dev, host = pools()
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    d_idx.set_(page_indices([3, 200], PS))
    with pytest.raises(errors.IndexOutOfRangeError):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    assert len(validations) == 2


def test_cpu_indices_written_behind_torch_are_caught(validations: list[int]) -> None:
    """CPU indices keep a value check (a memcmp, no device sync): numpy writes bump no version."""
    dev, host = pools()
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    d_idx.numpy()[:PS] += 10 * dev.size
    with pytest.raises(errors.IndexOutOfRangeError):
        host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    assert len(validations) == 2


def test_device_layer_storage_is_checked_on_the_memo_path(validations: list[int]) -> None:
    dev, host = pools()
    h_idx, d_idx = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
    host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    assert len(validations) == 1
    dev.kv_buffer[2].set_(torch.zeros_like(dev.kv_buffer[2]))
    host.load_to_device_per_layer(dev, h_idx, d_idx, 2, "direct")
    assert len(validations) == 2  # moved storage: validated again (and accepted)


def _inference_indices() -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        return page_indices([1, 2], PS), page_indices([3, 4], PS)


def test_inference_mode_indices_load_every_layer(validations: list[int]) -> None:
    """Engines build index tensors under ``torch.inference_mode``; those have no ``_version``."""
    dev, host = pools()
    h_idx, d_idx = _inference_indices()
    assert h_idx.is_inference()
    with torch.inference_mode():
        for layer in range(LAYERS):
            host.load_to_device_per_layer(dev, h_idx, d_idx, layer, "direct")
    for layer in range(LAYERS):
        assert torch.equal(dev.kv_buffer[layer][d_idx], host.kv_buffer[layer][h_idx])
    # CPU values are compared (a memcmp): the memo still applies.
    assert len(validations) == 1
    with torch.inference_mode():
        d_idx[:PS] += 10 * dev.size  # an in-place write that bumps no version counter
        with pytest.raises(errors.IndexOutOfRangeError):
            host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")


@pytest.mark.usefixtures("accelerator_policy")
def test_inference_mode_indices_on_an_accelerator_are_validated_per_layer(
    validations: list[int],
) -> None:
    """No version counter and no value read: nothing proves them unchanged, so validate again."""
    dev, host = pools()
    h_idx, d_idx = _inference_indices()
    with torch.inference_mode():
        host.load_to_device_per_layer(dev, h_idx, d_idx, 0, "direct")
        d_idx[:PS] += 10 * dev.size  # invisible to a version check
        with pytest.raises(errors.IndexOutOfRangeError):
            host.load_to_device_per_layer(dev, h_idx, d_idx, 1, "direct")
    assert len(validations) == 2
