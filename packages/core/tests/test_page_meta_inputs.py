"""``get_page_buffer_meta`` called directly with a sequence: nothing is rounded.

L3 stores validate host indices themselves (``sgl_core.l3._pages``) before
they call the pool, but the pool's own helper is public: a float index must
be a typed error, never truncated to another page's address.
"""

from __future__ import annotations

import pytest
import torch

import sgl_core
import sgl_core.backend
from sgl_core import errors

PS = 4


def _host() -> sgl_core.backend.TokenRowHostPool:
    backend = sgl_core.TorchBackend()
    dev = backend.create_device_pool(
        size=6 * PS,
        page_size=PS,
        dtype=torch.bfloat16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=2,
    )
    return backend.create_host_pool(dev, layout="page_first")


def test_int_sequence_gives_its_page() -> None:
    host = _host()
    ptrs, _ = host.get_page_buffer_meta([4, 5, 6, 7])
    assert ptrs == [host.kv_buffer.data_ptr() + 4 * host.shape.layout_dim]


@pytest.mark.parametrize("bad", [[4.5, 5.5, 6.5, 7.5], [4.0, 5.0, 6.0, 7.0]])
def test_float_sequence_is_a_typed_error(bad: list[float]) -> None:
    host = _host()
    with pytest.raises(errors.IndexDTypeError):
        host.get_page_buffer_meta(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ([True, False, True, False], errors.IndexDTypeError),
        ("4567", errors.IndexDTypeError),
        (4, errors.IndexDTypeError),
        ([2**70] * PS, errors.IndexOutOfRangeError),
    ],
)
def test_other_bad_sequences_are_typed_errors(bad: object, error: type[Exception]) -> None:
    host = _host()
    with pytest.raises(error):
        host.get_page_buffer_meta(bad)  # type: ignore[arg-type]
