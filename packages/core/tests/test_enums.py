from __future__ import annotations

import pytest

from sgl_core import HostLayout, IOBackend


def test_engine_strings_are_accepted() -> None:
    assert HostLayout("page_first") is HostLayout.PAGE_FIRST
    assert HostLayout("Page-First-Direct") is HostLayout.PAGE_FIRST_DIRECT
    assert IOBackend("direct") is IOBackend.DIRECT
    assert IOBackend("kernel_ascend") is IOBackend.KERNEL_ASCEND
    assert HostLayout.LAYER_FIRST == "layer_first"
    assert str(IOBackend.KERNEL) == "kernel"


def test_parse_names_the_argument() -> None:
    with pytest.raises(ValueError, match="layout='diagonal' is not one of"):
        HostLayout.parse("diagonal", argument="layout")
    assert IOBackend.parse("kernel", argument="io_backend") is IOBackend.KERNEL
    with pytest.raises(ValueError, match="io_backend=3"):
        IOBackend.parse(3, argument="io_backend")
