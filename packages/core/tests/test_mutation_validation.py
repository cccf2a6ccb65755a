"""Boundary tests of the index checks, slot accounting and load memo (issue #18).

Each test pins one edge of a check that mutation testing (``scripts/mutation.sh
validation``) found unexercised: an off-by-one bound, a branch no test took, a
value the check must hand back unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core import errors
from sgl_core.kv._validation import (
    as_index_tensor,
    check_backed,
    check_index_bounds,
    check_index_device,
    check_index_pair,
    check_index_tensor,
    check_layer_id,
    check_page_runs,
    check_unique,
)
from sgl_core.kv.host._load_memo import CheckedLoad, IndexStamp, reads_contents, tensor_signature
from sgl_core.testing import fill_device_random, host_bytes, page_indices

PS = 4
PAGES = 4


def i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


# ----------------------------------------------------------------- index checks
def test_check_index_tensor_returns_the_tensor_and_names_each_problem() -> None:
    t = i64(1, 2)
    assert check_index_tensor(t, "idx") is t
    with pytest.raises(errors.IndexDTypeError, match=r"idx must be a torch\.Tensor"):
        check_index_tensor([1, 2], "idx")
    with pytest.raises(errors.IndexDTypeError, match="idx must have dtype"):
        check_index_tensor(t.int(), "idx")
    with pytest.raises(errors.IndexShapeError, match="idx must be 1-D"):
        check_index_tensor(t.view(1, 2), "idx")
    with pytest.raises(errors.DeviceError, match="idx is a meta tensor"):
        check_index_tensor(t.to("meta"), "idx")


def test_as_index_tensor_takes_ints_only_and_keeps_their_values() -> None:
    t = i64(3)
    assert as_index_tensor(t, "idx") is t
    for given in ([5, 0, 7], (5, 0, 7), np.array([5, 0, 7], dtype=np.int32)):
        out = as_index_tensor(given, "idx")
        assert out.dtype == torch.int64 and out.tolist() == [5, 0, 7]
    assert as_index_tensor([np.int64(2**62)], "idx").tolist() == [2**62]
    assert as_index_tensor([], "idx").numel() == 0
    for bad in ("12", b"12", bytearray(b"12"), {1, 2}, 3, None):
        with pytest.raises(errors.IndexDTypeError, match=r"idx must be a torch\.int64 tensor"):
            as_index_tensor(bad, "idx")
    for bad_item in ([1, True], [np.bool_(True)], [1.0], ["1"]):
        with pytest.raises(errors.IndexDTypeError, match="idx must hold ints"):
            as_index_tensor(bad_item, "idx")
    with pytest.raises(errors.IndexOutOfRangeError, match="idx holds a value outside int64"):
        as_index_tensor([2**63], "idx")
    with pytest.raises(errors.IndexOutOfRangeError):
        as_index_tensor([-(2**63) - 1], "idx")


def test_check_index_device_accepts_cpu_and_the_pool_device_only() -> None:
    meta = torch.device("meta")
    check_index_device(i64(1), "idx", meta)  # CPU indices go with any pool
    check_index_device(i64(1).to("meta"), "idx", meta)  # the pool's own device
    with pytest.raises(errors.DeviceError, match="idx is on meta"):
        check_index_device(i64(1).to("meta"), "idx", torch.device("cpu"))


def test_check_index_pair_names_both_lengths() -> None:
    a, b = i64(1, 2), i64(3, 4)
    assert check_index_pair(a, "a", b, "b") == (a, b)
    with pytest.raises(errors.IndexShapeError, match="a and b must have equal length, got 2 and 1"):
        check_index_pair(a, "a", b[:1], "b")
    with pytest.raises(errors.IndexDTypeError, match="b must have dtype"):
        check_index_pair(a, "a", b.int(), "b")
    with pytest.raises(errors.IndexDTypeError, match=r"a must be a torch\.Tensor"):
        check_index_pair(None, "a", b, "b")


def test_check_index_bounds_edges() -> None:
    check_index_bounds(i64(), 0, "idx")
    check_index_bounds(i64(0, 4), 5, "idx")
    check_index_bounds(i64(4), 5, "idx")
    with pytest.raises(errors.IndexOutOfRangeError, match=r"idx holds 5, outside the valid range"):
        check_index_bounds(i64(0, 5), 5, "idx")
    with pytest.raises(errors.IndexOutOfRangeError, match=r"idx holds -1, outside"):
        check_index_bounds(i64(-1, 3), 5, "idx")
    with pytest.raises(errors.IndexOutOfRangeError, match=r"idx holds -2, outside"):
        check_index_bounds(i64(-2, 9), 5, "idx")  # both ends bad: the low one is named


@pytest.mark.parametrize("limit", [None, 8, 8 * 64, 10_000])
def test_check_unique_on_both_paths(limit: int | None) -> None:
    """The mask path (small ``limit``) and the sort path agree."""
    check_unique(i64(), "idx", limit)
    check_unique(i64(7), "idx", limit)
    check_unique(i64(7, 0, 3), "idx", limit)
    with pytest.raises(errors.DuplicateIndexError, match="idx contains duplicate"):
        check_unique(i64(0, 3, 0), "idx", limit)
    with pytest.raises(errors.DuplicateIndexError):
        check_unique(i64(7, 7), "idx", limit)


def test_check_page_runs_edges() -> None:
    check_page_runs(i64(), 4, "idx")
    check_page_runs(i64(8, 9, 10, 11, 0, 1, 2, 3), 4, "idx")
    check_page_runs(i64(5, 2), 1, "idx")
    with pytest.raises(errors.PageAlignmentError, match="idx has 3 indices, not a whole number"):
        check_page_runs(i64(0, 1, 2), 4, "idx")
    with pytest.raises(errors.PageAlignmentError, match="idx must be whole pages"):
        check_page_runs(i64(1, 2, 3, 4), 4, "idx")  # consecutive, not on a boundary
    with pytest.raises(errors.PageAlignmentError, match="idx must be whole pages"):
        check_page_runs(i64(0, 1, 3, 2), 4, "idx")  # on a boundary, not consecutive
    with pytest.raises(errors.PageAlignmentError):
        check_page_runs(i64(0, 1, 2, 3, 4, 6, 5, 7), 4, "idx")  # second page bad only
    check_page_runs(i64(6, 7, 0, 1), 2, "idx")
    with pytest.raises(errors.PageAlignmentError):
        check_page_runs(i64(6, 7, 1, 2), 2, "idx")  # pages of two: the second off a boundary


def test_check_layer_id_edges() -> None:
    assert check_layer_id(0, 3) == 0
    assert check_layer_id(2, 3) == 2
    for bad in (True, 1.0, "1", None):
        with pytest.raises(errors.ArgumentTypeError, match="layer_id must be an int"):
            check_layer_id(bad, 3)
    for bad_id in (-1, 3):
        with pytest.raises(errors.LayerIndexError, match=rf"layer_id={bad_id} is outside \[0, 3\)"):
            check_layer_id(bad_id, 3)
    # any integer: numpy integers and 0-d integer tensors, as a plain int; no bools of any kind
    for good in (np.int64(2), torch.tensor(2), torch.tensor(2, dtype=torch.int32)):
        got = check_layer_id(good, 3)
        assert got == 2 and type(got) is int
    for bad in (np.bool_(True), torch.tensor(True), torch.tensor(False), torch.tensor(1.0)):
        with pytest.raises(errors.ArgumentTypeError, match="layer_id must be an int"):
            check_layer_id(bad, 3)


def test_check_backed_exact_fit_and_one_short() -> None:
    base = torch.zeros(24, dtype=torch.int16)
    check_backed(base, "t")
    check_backed(base[4:].view(4, 5), "t")  # ends on the storage's last element
    check_backed(base.view(4, 6)[:, 1:3], "t")  # strided view inside
    check_backed(base[:0], "t")
    check_backed(base[24:], "t")  # empty, at the end
    check_backed(torch.zeros(()), "t")
    short = torch.zeros(24, dtype=torch.int16)
    view = short.view(4, 6)
    last, all_but_last = view[3:, 5:], view[3:, :5]
    short.untyped_storage().resize_(23 * 2)  # one element short
    with pytest.raises(errors.PoolMismatchError, match="t reaches past the end"):
        check_backed(view, "t")
    with pytest.raises(errors.PoolMismatchError, match="t reaches past the end"):
        check_backed(last, "t")  # only the last element is gone
    check_backed(all_but_last, "t")  # ... so this one is still backed
    with pytest.raises(errors.PoolMismatchError, match="t is a meta tensor"):
        check_backed(torch.zeros(2, device="meta"), "t")
    odd = torch.zeros(10, dtype=torch.int32)
    odd.untyped_storage().resize_(39)  # a partial last element
    with pytest.raises(errors.PoolMismatchError):
        check_backed(odd, "t")


# ------------------------------------------------------------ slot accounting
def host_pool() -> tuple[sgl_core.backend.PerLayerMLADevicePool, sgl_core.backend.TokenRowHostPool]:
    dev = sgl_core.TorchBackend().create_device_pool(
        size=PAGES * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=8,
        qk_rope_head_dim=8,
        layer_num=2,
    )
    fill_device_random(dev, 0)
    return dev, sgl_core.TorchBackend().create_host_pool(dev, layout="page_first")


def test_alloc_and_free_account_every_slot() -> None:
    _, host = host_pool()
    total = host.available_size()
    assert total == host.size
    empty = host.alloc(0)
    assert empty is not None and empty.numel() == 0 and host.available_size() == total
    a = host.alloc(PS)
    assert a is not None and a.tolist() == list(range(PS))
    assert host.available_size() == total - PS
    b = host.alloc(total - PS)
    assert b is not None and host.available_size() == 0
    assert host.alloc(PS) is None and host.available_size() == 0
    assert host.free(a) == PS and host.available_size() == PS
    again = host.alloc(PS)
    assert again is not None and again.tolist() == a.tolist()
    assert host.free(b[PS : 2 * PS]) == PS
    assert host.free(i64()) == 0
    host.clear()
    assert host.available_size() == total
    assert host.alloc(total) is not None


@pytest.mark.parametrize("bad", [-PS, True, 1.0 * PS, PS + 1, 1])
def test_alloc_rejects_bad_sizes_and_takes_nothing(bad: object) -> None:
    _, host = host_pool()
    before = host.available_size()
    error = errors.PageAlignmentError if isinstance(bad, int) and bad > 0 else errors.PoolSizeError
    if bad is True:
        error = errors.PoolSizeError
    with pytest.raises(error):
        host.alloc(bad)  # type: ignore[arg-type]
    assert host.available_size() == before


def test_free_rejects_and_changes_no_accounting() -> None:
    _, host = host_pool()
    taken = host.alloc(2 * PS)
    assert taken is not None
    first = taken[:PS]
    cases = {
        "same slot twice in one call": torch.cat([first, first]),
        "partial page": first[:2],
        "not a page run": first.flip(0),
        "out of range": i64(*range(host.size, host.size + PS)),
        "negative": i64(-1, 0, 1, 2),
        "never allocated": i64(*range(2 * PS, 3 * PS)),
    }
    for name, indices in cases.items():
        with pytest.raises(errors.FreeError):
            host.free(indices)
        assert host.available_size() == host.size - 2 * PS, name
    with pytest.raises(errors.FreeError, match="frees the same slot twice"):
        host.free(torch.cat([first, first]))
    with pytest.raises(errors.FreeError, match=f"holds slot {2 * PS}, which is not allocated"):
        host.free(i64(*range(2 * PS, 3 * PS)))
    with pytest.raises(errors.IndexDTypeError):
        host.free(first.int())
    assert host.free(first) == PS
    with pytest.raises(errors.FreeError, match="not allocated"):
        host.free(first)  # a double free across calls
    assert host.available_size() == host.size - PS
    # a page half freed and half allocated is rejected whole
    mixed = torch.cat([taken[PS:], first])
    with pytest.raises(errors.FreeError, match=f"holds slot {int(first[0])}"):
        host.free(mixed)
    assert host.free(taken[PS:]) == PS and host.available_size() == host.size


# ------------------------------------------------------------- L3 page helpers
def test_page_start_and_page_meta_edges() -> None:
    _, host = host_pool()
    last = host.size - PS
    host.get_data_page(0)
    host.get_data_page(last)
    for bad in (True, float(PS), "0"):
        with pytest.raises(errors.ArgumentTypeError):
            host.get_data_page(bad)  # type: ignore[arg-type]
    for out in (-PS, host.size):
        with pytest.raises(errors.IndexOutOfRangeError):
            host.get_data_page(out)
    with pytest.raises(errors.PageAlignmentError):
        host.get_data_page(1)
    ptrs, sizes = host.get_page_buffer_meta(list(range(last, host.size)))
    assert len(ptrs) == len(sizes) == 1
    ptrs, _ = host.get_page_buffer_meta(page_indices([1, 0], PS))
    assert ptrs[0] - ptrs[1] == PS * host.layer_num * host.shape.token_stride_size
    with pytest.raises(errors.IndexOutOfRangeError):
        host.get_page_buffer_meta(list(range(host.size, host.size + PS)))
    with pytest.raises(errors.PageAlignmentError):
        host.get_page_buffer_meta([0, 1])


def test_set_from_flat_data_page_checks_before_writing() -> None:
    _, host = host_pool()
    before = host_bytes(host)
    page = host.get_dummy_flat_data_page()
    for bad in (page[:-1], page.float(), torch.cat([page, page[:1]])):
        with pytest.raises(errors.PoolMismatchError):
            host.set_from_flat_data_page(PS, bad)
    with pytest.raises(errors.ArgumentTypeError):
        host.set_from_flat_data_page(PS, page.tolist())  # type: ignore[arg-type]
    assert all(torch.equal(x, y) for x, y in zip(before, host_bytes(host), strict=True))
    ones = torch.ones_like(page)
    host.set_from_flat_data_page(PS, ones)
    assert torch.equal(host.get_data_page(PS), ones)


# ------------------------------------------------------------------ load memo
def test_index_stamp_notices_every_change() -> None:
    t = i64(0, 1, 2, 3)
    stamp = IndexStamp(t)
    assert stamp.matches(t)
    assert not stamp.matches(t.clone())  # equal values, another object
    assert not stamp.matches(None)
    t.add_(0)  # an in-place write bumps the version
    assert not stamp.matches(t)
    stamp = IndexStamp(t)
    t.numpy()[0] = 1  # behind torch's back: only the value check sees it
    assert not stamp.matches(t)
    stamp = IndexStamp(t)
    t.set_(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7]).untyped_storage(), 0, (4,), (1,))
    assert not stamp.matches(t)
    u = i64(0, 1, 2, 3, 4, 5, 6, 7)
    stamp = IndexStamp(u)
    with torch.no_grad():
        u.as_strided_((4,), (2,))  # same storage and first address, new stride
    assert not stamp.matches(u)
    v = i64(0, 1, 2, 3)
    stamp = IndexStamp(v)
    v.resize_(2)
    assert not stamp.matches(v)


def test_index_stamp_of_inference_tensors() -> None:
    with torch.inference_mode():
        t = i64(0, 1, 2, 3)
    stamp = IndexStamp(t)  # no version counter: the CPU value check decides
    assert stamp.version is None and stamp.matches(t)
    t.numpy()[1] = 7
    assert not stamp.matches(t)
    stamp = IndexStamp(t)
    stamp.values = None  # as on an accelerator: nothing can prove it unchanged
    assert not stamp.matches(t)


def test_reads_contents_and_tensor_signature() -> None:
    assert reads_contents(torch.device("cpu"))
    assert not reads_contents(torch.device("meta"))
    t = torch.zeros(4, 6, dtype=torch.int16)
    sig = tensor_signature(t)
    assert sig == tensor_signature(t)
    assert sig != tensor_signature(t[1:])  # address
    assert sig != tensor_signature(t.view(6, 4))  # shape
    assert sig != tensor_signature(t.t())  # strides
    assert sig != tensor_signature(t.view(torch.uint16))  # dtype
    t.untyped_storage().resize_(40)
    assert tensor_signature(t)[-1] == 40 and sig[-1] == 48


def test_checked_load_matches_only_the_same_arguments() -> None:
    dev, host = host_pool()
    h, d = page_indices([0], PS), page_indices([1], PS)
    transfer = host._check_transfer(dev, h, d, "direct", "device_indices")
    checked = CheckedLoad((dev,), "direct", transfer, [])
    h2, d2 = transfer.host_indices, transfer.device_indices
    assert checked.matches((dev,), h2, d2, "direct")
    assert not checked.matches((dev,), h2, d2, "kernel")
    assert not checked.matches((dev, dev), h2, d2, "direct")
    assert not checked.matches((host,), h2, d2, "direct")
    assert not checked.matches((dev,), d2, h2, "direct")
    assert not checked.matches((dev,), h2, h2, "direct")
    assert not checked.matches((dev,), d2, d2, "direct")


def test_free_and_page_meta_errors_name_their_argument() -> None:
    """The caller's argument is ``indices``: every message starts with it."""
    _, host = host_pool()
    taken = host.alloc(PS)
    assert taken is not None
    with pytest.raises(errors.IndexDTypeError, match=r"^indices must have dtype"):
        host.free(taken.int())
    with pytest.raises(errors.FreeError, match=rf"^indices holds {host.size + PS - 1}, outside"):
        host.free(i64(*range(host.size, host.size + PS)))
    with pytest.raises(errors.FreeError, match=r"^indices has 2 indices"):
        host.free(taken[:2])
    with pytest.raises(errors.IndexDTypeError, match=r"^indices must hold ints"):
        host.get_page_buffer_meta([0.0] * PS)
    with pytest.raises(errors.IndexOutOfRangeError, match=rf"^indices holds {host.size + PS - 1}"):
        host.get_page_buffer_meta(list(range(host.size, host.size + PS)))
    with pytest.raises(errors.PageAlignmentError, match=r"^indices must be whole pages"):
        host.get_page_buffer_meta(list(range(1, PS + 1)))
