"""Host layouts and io backends, accepting the serving engines' strings."""

from __future__ import annotations

import enum
from typing import TypeVar

__all__ = ["HostLayout", "IOBackend"]

_E = TypeVar("_E", bound="_StrChoice")


class _StrChoice(str, enum.Enum):
    """A str-valued enum whose constructor also takes any-case strings.

    ``HostLayout("page_first") is HostLayout.PAGE_FIRST``: engines that pass
    their own strings work unchanged, and ``str(member)`` is that string.
    """

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def _missing_(cls, value: object) -> _StrChoice | None:
        if isinstance(value, str):
            wanted = value.strip().lower().replace("-", "_")
            for member in cls:
                if member.value == wanted:
                    return member
        return None

    @classmethod
    def parse(cls: type[_E], value: object, *, argument: str) -> _E:
        """Coerce ``value``; raise a ``ValueError`` naming ``argument`` otherwise."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"{argument}={value!r} is not one of {choices}") from None


class HostLayout(_StrChoice):
    """How a host pool arranges (token, layer) rows; see docs/design.md section 5."""

    LAYER_FIRST = "layer_first"
    PAGE_FIRST = "page_first"
    PAGE_FIRST_DIRECT = "page_first_direct"
    PAGE_FIRST_KV_SPLIT = "page_first_kv_split"
    #: MHA only: page-major with heads outside tokens, ``(page, head, token, layer, dim)``.
    PAGE_HEAD = "page_head"


class IOBackend(_StrChoice):
    """Which copy engine moves bytes between device and host pools."""

    KERNEL = "kernel"
    DIRECT = "direct"
    KERNEL_ASCEND = "kernel_ascend"
