"""The per-layer load memo through the public calls (issue #24, "Tests that notice").

``test_load_memo.py`` pins the policy on MLA pools, changing the device
indices; here every other part the memo compares is changed between the
layer loads of one batch, on MHA pools (K *and* V per layer, so a change
to the second component is seen) and on MLA pools: the host indices, the
io backend, the device pool, a V layer tensor replaced or resized, an index
tensor's dtype or strides. A change is validated again (and refused with a
typed error, both pools byte-identical, where it is bad); an unchanged batch
is validated once and moves exact bytes.
"""

from __future__ import annotations

import pytest
import torch

import sgl_core
from sgl_core import errors
from sgl_core.kv.host._host_pool import HostPoolBase
from sgl_core.testing import device_rows, fill_device_random, page_indices, same_bytes, snapshot

PS = 4
LAYERS = 3


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = HostPoolBase._check_transfer

    def counting(self: HostPoolBase, *args: object, **kwargs: object) -> object:  # type: ignore[type-arg]
        calls.append(1)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(HostPoolBase, "_check_transfer", counting)
    return calls


def mha(seed: int = 0, v_head_dim: int | None = 4) -> tuple[object, object]:
    backend = sgl_core.TorchBackend()
    dev = backend.create_mha_device_pool(
        size=6 * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        head_num=2,
        head_dim=8,
        layer_num=LAYERS,
        v_head_dim=v_head_dim,
    )
    fill_device_random(dev, seed)
    host = backend.create_host_pool(dev, layout="layer_first")
    return dev, host


def backed_up(seed: int = 0) -> tuple[object, object, torch.Tensor]:
    """An MHA pool pair whose host pages 1..2 hold device pages 1..2; a fresh target pool."""
    src, host = mha(seed)
    idx = page_indices([1, 2], PS)
    host.backup_from_device_all_layer(src, idx, idx, "direct")  # type: ignore[attr-defined]
    dst, _ = mha(seed + 1)
    return src, host, dst


def rows(dev: object, layer: int, loc: torch.Tensor) -> torch.Tensor:
    return device_rows(dev, layer, loc)  # type: ignore[arg-type]


def test_an_unchanged_batch_is_validated_once_and_moves_exact_bytes(
    validations: list[int],
) -> None:
    src, host, dst = backed_up()
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    for layer in range(LAYERS):
        host.load_to_device_per_layer(dst, h, d, layer, "direct")  # type: ignore[attr-defined]
    assert len(validations) == 2  # the backup and the first load
    for layer in range(LAYERS):
        assert torch.equal(rows(dst, layer, d), rows(src, layer, h))


def test_host_indices_written_between_layers_are_validated_again(
    validations: list[int],
) -> None:
    _, host, dst = backed_up()
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # type: ignore[attr-defined]
    before = snapshot(dst, host)  # type: ignore[arg-type]
    h.numpy()[0] = host.size + 5  # type: ignore[attr-defined]  # behind torch's back
    with pytest.raises(errors.IndexOutOfRangeError):
        host.load_to_device_per_layer(dst, h, d, 1, "direct")  # type: ignore[attr-defined]
    assert same_bytes(before, snapshot(dst, host))  # type: ignore[arg-type]
    h.numpy()[0] = PS
    h2 = h
    h2 += 0  # a torch write: a new version, same values: validated again, accepted
    host.load_to_device_per_layer(dst, h2, d, 1, "direct")  # type: ignore[attr-defined]
    assert len(validations) == 4


def test_another_io_backend_between_layers_is_validated_again(validations: list[int]) -> None:
    _, host, dst = backed_up()
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # type: ignore[attr-defined]
    before = snapshot(dst, host)  # type: ignore[arg-type]
    with pytest.raises(errors.UnsupportedLayoutError):
        host.load_to_device_per_layer(dst, h, d, 1, "kernel")  # type: ignore[attr-defined]
    assert same_bytes(before, snapshot(dst, host))  # type: ignore[arg-type]
    assert len(validations) == 3


def test_another_device_pool_between_layers_is_validated_again(validations: list[int]) -> None:
    src, host, dst = backed_up()
    other, _ = mha(7, v_head_dim=None)  # another geometry: V of 8, not 4
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # type: ignore[attr-defined]
    before = snapshot(dst, host)  # type: ignore[arg-type]
    other_rows = [rows(other, layer, d) for layer in range(LAYERS)]
    with pytest.raises(errors.PoolMismatchError):
        host.load_to_device_per_layer(other, h, d, 1, "direct")  # type: ignore[attr-defined]
    assert same_bytes(before, snapshot(dst, host))  # type: ignore[arg-type]
    assert all(torch.equal(rows(other, i, d), other_rows[i]) for i in range(LAYERS))
    same_shape, _ = mha(8)
    host.load_to_device_per_layer(same_shape, h, d, 1, "direct")  # type: ignore[attr-defined]
    assert torch.equal(rows(same_shape, 1, d), rows(src, 1, h))
    assert len(validations) == 4


@pytest.mark.parametrize("component", ["k_buffer", "v_buffer"])
def test_a_layer_tensor_replaced_in_the_list_is_refused_at_the_next_layer(
    validations: list[int], component: str
) -> None:
    _, host, dst = backed_up()
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # type: ignore[attr-defined]
    layers = getattr(dst, component)
    layers[2] = torch.zeros(layers[2].shape[0], 2, 1, dtype=torch.bfloat16)  # a wrong width
    before = [rows(dst, i, torch.arange(7 * PS)) for i in (0, 1)]
    host_before = snapshot(dst, host)[LAYERS:]  # type: ignore[arg-type]
    for layer in (1, 0):  # every layer's load re-checks the whole pool
        with pytest.raises(errors.PoolMismatchError, match=f"{component}\\[2\\]"):
            host.load_to_device_per_layer(dst, h, d, layer, "direct")  # type: ignore[attr-defined]
    assert all(torch.equal(rows(dst, i, torch.arange(7 * PS)), before[i]) for i in (0, 1))
    assert same_bytes(host_before, snapshot(dst, host)[LAYERS:])  # type: ignore[arg-type]


@pytest.mark.parametrize("component", ["k_buffer", "v_buffer"])
def test_a_layer_storage_resized_in_place_is_refused(
    validations: list[int], component: str
) -> None:
    _, host, dst = backed_up()
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # type: ignore[attr-defined]
    other = "v_buffer" if component == "k_buffer" else "k_buffer"
    kept = getattr(dst, other)[2].clone()
    # same object and shape; the pool's one allocation shrinks to 16 bytes
    getattr(dst, component)[2].untyped_storage().resize_(16)
    with pytest.raises(errors.PoolMismatchError, match=f"{component}.*past the end"):
        host.load_to_device_per_layer(dst, h, d, 2, "direct")  # type: ignore[attr-defined]
    assert torch.equal(
        getattr(dst, other)[2].view(torch.int16), kept.view(torch.int16)
    )  # the other half of the layer untouched
    assert len(validations) == 3


@pytest.mark.parametrize("component", ["k_buffer", "v_buffer"])
def test_a_layer_moved_to_new_storage_is_validated_and_loaded_there(
    validations: list[int], component: str
) -> None:
    src, host, dst = backed_up()
    h, d = page_indices([1, 2], PS), page_indices([3, 4], PS)
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # type: ignore[attr-defined]
    layer = getattr(dst, component)[2]
    old = layer.clone()
    layer.set_(torch.zeros_like(layer))  # same object and shape, other memory
    host.load_to_device_per_layer(dst, h, d, 2, "direct")  # type: ignore[attr-defined]
    assert len(validations) == 3
    assert torch.equal(rows(dst, 2, d), rows(src, 2, h))
    assert not torch.equal(old.view(torch.int16), layer.view(torch.int16))  # new storage written


def test_an_index_view_with_other_strides_is_validated_again(validations: list[int]) -> None:
    src, host, dst = backed_up()
    h = page_indices([1, 2], PS)
    wide = torch.arange(0, 4 * PS, dtype=torch.int64) + 3 * PS  # slots 12..27
    d = wide[: 2 * PS]  # slots 12..19: device pages 3, 4
    host.load_to_device_per_layer(dst, h, d, 0, "direct")  # type: ignore[attr-defined]
    with torch.no_grad():
        d.as_strided_((2 * PS,), (2,))  # same first address and shape: slots 12, 14, .., 26
    assert d.data_ptr() == wide.data_ptr() and d.tolist() == list(range(12, 28, 2))
    host.load_to_device_per_layer(dst, h, d, 1, "direct")  # type: ignore[attr-defined]
    assert len(validations) == 3
    assert torch.equal(rows(dst, 1, d), rows(src, 1, h))  # the new slots, not 12..19


def test_each_stamp_field_is_checked_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Tensor.data = ...`` changes shape or strides without a new version.

    With index values not read back (as on an accelerator), the shape and the
    strides are what shows such a change; each must be enough on its own.
    """
    from sgl_core.kv.host import _load_memo

    monkeypatch.setattr(_load_memo, "reads_contents", lambda device: False)
    t = torch.arange(4, dtype=torch.int64)
    stamp = _load_memo.IndexStamp(t)
    assert stamp.values is None and stamp.matches(t)
    t.data = t.data[:2]  # same address, strides and version; another shape
    assert t._version == stamp.version and not stamp.matches(t)
    base = torch.arange(8, dtype=torch.int64)
    u = base[:4]
    stamp = _load_memo.IndexStamp(u)
    u.data = base.as_strided((4,), (2,))  # same address, shape and version; other strides
    assert u._version == stamp.version and not stamp.matches(u)
    w = torch.arange(4, dtype=torch.int64)
    stamp = _load_memo.IndexStamp(w)
    w.data = w.data.view(torch.float64)  # same address, shape, strides; another dtype
    assert not stamp.matches(w)
