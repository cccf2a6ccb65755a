"""A transfer leaves the caller's index tensors as it found them, resizable included:
``Tensor.numpy()`` marks a storage unresizable for good, so an engine that reuses
an index buffer with ``resize_`` would fail on its next batch. Our numpy views of
caller indices are views by address (used within the call) or copies (kept)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import sgl_core
from sgl_core import errors
from sgl_core.kv._validation import check_unique
from sgl_core.testing import device_rows, fill_device_random, page_indices
from sgl_core.transfer.copy._pieces import index_array, merge_runs
from sgl_core.transfer.copy._tuning import CopyTuning

TUNINGS = {"auto": None, "one thread": CopyTuning(copy_threads=1)}


def resizable(t: torch.Tensor) -> bool:
    """Whether ``t`` can still grow in place (checked on a view: ``t`` keeps its size)."""
    probe = t.view(t.shape)  # the same storage
    try:
        probe.resize_(t.untyped_storage().nbytes() // t.element_size() + 64)
    except RuntimeError:
        return False
    return True


def test_the_probe_sees_an_unresizable_storage() -> None:
    t = torch.arange(8)
    assert resizable(t)
    t.numpy()
    assert not resizable(t)


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_backup_and_load_leave_the_indices_resizable(layout: str, page: int, tuning: str) -> None:
    backend = sgl_core.TorchBackend(tuning=TUNINGS[tuning])
    dev = backend.create_device_pool(
        size=64 * page, page_size=page, dtype=torch.bfloat16, kv_lora_rank=16,
        qk_rope_head_dim=8, layer_num=3,
    )  # fmt: skip
    fill_device_random(dev, 1)
    host = backend.create_host_pool(dev, layout=layout)
    h_idx, d_idx = page_indices([9, 2, 30, 5], page), page_indices([7, 1, 40, 3], page)
    host.backup_from_device_all_layer(dev, h_idx, d_idx, "direct")
    out = page_indices([11, 20, 4, 50], page)
    for layer in range(3):
        host.load_to_device_per_layer(dev, h_idx, out, layer, "direct")
        assert torch.equal(device_rows(dev, layer, out), device_rows(dev, layer, d_idx))
    for t in (h_idx, d_idx, out):
        assert resizable(t)


def test_checks_and_run_merging_leave_the_indices_resizable() -> None:
    a, b = torch.tensor([3, 4, 9, 1]), torch.tensor([0, 1, 2, 7])
    check_unique(a, "a", 16)
    check_unique(b, "b")
    assert list(merge_runs(a, b)) == [(3, 0, 2), (9, 2, 1), (1, 7, 1)]
    assert resizable(a) and resizable(b)


def test_indices_are_read_by_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither ``Tensor.numpy()`` (it marks the storage unresizable) nor DLPack (numpy's
    import refuses a pinned tensor, which exports itself as CUDA host memory): the
    checks and the run merging read indices by address."""

    def refused(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise AssertionError("read by address only")

    monkeypatch.setattr(torch.Tensor, "numpy", refused)
    monkeypatch.setattr(torch.Tensor, "__dlpack__", refused)
    idx = torch.tensor([3, 4, 9, 1])
    with pytest.raises(AssertionError):
        np.from_dlpack(idx)  # the probe bites
    check_unique(idx, "idx", 16)
    check_unique(idx, "idx")
    with pytest.raises(errors.DuplicateIndexError):
        check_unique(torch.tensor([3, 4, 3]), "idx", 16)
    assert list(merge_runs(idx, idx)) == [(3, 3, 2), (9, 9, 1), (1, 1, 1)]


def test_index_array_keeps_values_dtype_and_strides() -> None:
    base = torch.tensor([-5, 7, 2**40, 3, 11], dtype=torch.int64)
    view = index_array(base[1::2])
    assert view.dtype == np.int64 and view.tolist() == [7, 3]
    assert index_array(base).tolist() == base.tolist()  # negative and wide values kept
    small = torch.tensor([-1, 6], dtype=torch.int32)
    assert index_array(small).dtype == np.int32 and index_array(small).tolist() == [-1, 6]
    assert resizable(base) and resizable(small)


def test_index_array_is_a_read_only_view_that_keeps_its_tensor() -> None:
    t = torch.arange(512) * 3
    alive = weakref.ref(t)
    view = index_array(t)
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1
    t[1] = -7  # a view, not a copy
    del t
    gc.collect()
    assert alive() is not None and view[:3].tolist() == [0, -7, 6]
    del view
    gc.collect()
    assert alive() is None
