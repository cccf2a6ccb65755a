"""What a stored page's bytes mean: the :class:`PageFormat` of a host pool.

Why stores file pages by format: docs/design.md section 8 (a pool of another
format gets a miss; eviction may still remove pages, never misread them).
:func:`page_format` derives the format from the host pool's public
attributes only, never from its class or device family:

* always (the :class:`~sgl_core.MLAHostPool` protocol): ``layout`` (the flat
  page's byte order), ``dtype``, ``page_size``, ``layer_num``, and the byte
  size of each memory object of one page (``get_page_buffer_meta``);
* where the pool has them: the KV row dims ``kv_lora_rank`` and
  ``qk_rope_head_dim`` (on the pool or on its ``shape``) and ``kv_cache_dim``;
  ``flat_page_dtype``; the sparse-attention indexer parts
  ``indexer_layer_ids``, ``index_k_buffer`` and ``index_k_scale_buffer``
  (dtype and row width of each; ``None`` when the pool has none);
* ``page_format_fields()``: a mapping of extra fields (MHA heads, fp8 rows
  with scales, ...); each value is a ``str``, ``int``, ``float``, ``bool``,
  ``None``, a ``torch.dtype`` or a tuple/list of those, and may not repeat a
  derived field (so it cannot hide one). A new field changes the
  fingerprint: earlier pages become misses, never misreads.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from sgl_core.kv.protocols._kv_protocols import KVHostPool
from sgl_core.l3._protocol import PageStoreArgumentError

__all__ = ["FORMAT_VERSION", "PageFormat", "page_format"]

#: Bumped when the meaning of a field (or the fingerprint recipe) changes.
FORMAT_VERSION = 1


def _canon(value: object, what: str) -> object:
    """A JSON-able rendering of a field value; raises on anything else."""
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, enum.Enum):
        return _canon(value.value, what)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_canon(v, what) for v in value]
    raise PageStoreArgumentError(
        f"page format field {what} has a value of type {type(value).__name__}; "
        "use str, int, float, bool, None, torch.dtype or a tuple of those"
    )


def _json(value: object) -> str:
    """Canonical JSON (sorted keys, no spaces): what field texts and the fingerprint use."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class PageFormat:
    """The format of a host pool's flat pages; equal formats read each other's pages.

    ``layout`` is the host layout's name (the byte order of a flat page),
    ``dtype`` the KV element type, ``object_bytes`` the size of each memory
    object of one page in order. ``fields`` holds every other field as
    sorted ``(name, canonical JSON)`` pairs (see the module docstring).
    Build one with :func:`page_format`; compare with ``==`` or by
    :attr:`fingerprint`.
    """

    layout: str
    dtype: str
    page_size: int
    layer_num: int
    object_bytes: tuple[int, ...]
    fields: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("page_size", "layer_num"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise PageStoreArgumentError(f"PageFormat.{name} must be a positive int")
        if not self.object_bytes or any(
            isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in self.object_bytes
        ):
            raise PageStoreArgumentError(
                f"PageFormat.object_bytes must be positive ints, got {self.object_bytes!r}"
            )
        names = [name for name, _ in self.fields]
        if names != sorted(set(names)):
            raise PageStoreArgumentError("PageFormat.fields must be sorted, one per name")

    @property
    def page_bytes(self) -> int:
        """Bytes of one page (its objects together)."""
        return sum(self.object_bytes)

    @property
    def n_objects(self) -> int:
        """Memory objects per page."""
        return len(self.object_bytes)

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-able (what the fingerprint is computed over)."""
        doc: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "layout": self.layout,
            "dtype": self.dtype,
            "page_size": self.page_size,
            "layer_num": self.layer_num,
            "object_bytes": list(self.object_bytes),
        }
        for name, text in self.fields:
            doc[f"field:{name}"] = json.loads(text)
        return doc

    @functools.cached_property
    def digest(self) -> bytes:
        """16 bytes of SHA-256 over :meth:`as_dict` in canonical JSON."""
        return hashlib.sha256(_json(self.as_dict()).encode()).digest()[:16]

    @property
    def fingerprint(self) -> str:
        """:attr:`digest` as 32 hex characters (what keys and file names carry)."""
        return self.digest.hex()

    def describe(self) -> str:
        """One line for logs and errors."""
        extra = "".join(f", {name}={text}" for name, text in self.fields)
        return (
            f"{self.layout} {self.dtype} page_size={self.page_size} layers={self.layer_num} "
            f"objects={list(self.object_bytes)}{extra} [{self.fingerprint[:12]}]"
        )


def _positive_int(host: object, name: str) -> int:
    value = getattr(host, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PageStoreArgumentError(f"host.{name} must be a positive int, got {value!r}")
    return value


_SHAPE_FIELDS = ("kv_lora_rank", "qk_rope_head_dim")
_HOST_FIELDS = (*_SHAPE_FIELDS, "kv_cache_dim", "flat_page_dtype", "indexer_layer_ids")


def page_format(host: KVHostPool) -> PageFormat:
    """The :class:`PageFormat` of ``host``'s pages (see the module docstring).

    Raises :class:`~sgl_core.l3.PageStoreArgumentError` when ``host`` is not
    a host pool (it lacks an attribute the protocol promises).
    """
    try:
        page_size = _positive_int(host, "page_size")
        layer_num = _positive_int(host, "layer_num")
        if not isinstance(host.dtype, torch.dtype):
            raise PageStoreArgumentError(f"host.dtype must be a torch.dtype, got {host.dtype!r}")
        ptrs, sizes = host.get_page_buffer_meta(torch.arange(page_size, dtype=torch.int64))
        if not ptrs or len(ptrs) != len(sizes):
            raise PageStoreArgumentError(
                f"host.get_page_buffer_meta returned {len(ptrs)} pointers and {len(sizes)} sizes "
                "for one page"
            )
        fields: dict[str, object] = {}
        shape = getattr(host, "shape", None)
        for name in _HOST_FIELDS:
            value = getattr(host, name, None)
            if value is None and name in _SHAPE_FIELDS:  # row dims may live on the pool's shape
                value = getattr(shape, name, None)
            if value is not None:
                fields[name] = value
        for name in ("index_k_buffer", "index_k_scale_buffer"):
            if not hasattr(host, name):
                continue
            buffer = getattr(host, name)
            if buffer is None:
                fields[name] = None  # the pool has no such part
            elif isinstance(buffer, torch.Tensor) and buffer.dim() > 0:
                fields[name] = (str(buffer.dtype), int(buffer.shape[-1]))  # dtype, row width
            else:
                raise PageStoreArgumentError(f"host.{name} must be a tensor or None")
        hook = getattr(host, "page_format_fields", None)
        if hook is not None:
            extra = hook()
            if not isinstance(extra, Mapping):
                raise PageStoreArgumentError("host.page_format_fields() must return a mapping")
            for name, value in extra.items():
                if not isinstance(name, str) or not name:
                    raise PageStoreArgumentError(
                        f"page format field names must be str, got {name!r}"
                    )
                if name in fields:  # a declared value must not hide what the pool's buffers say
                    raise PageStoreArgumentError(
                        f"page_format_fields() declares {name!r}, a field derived from the pool"
                    )
                fields[name] = value
        layout = getattr(host.layout, "value", host.layout)
        if not isinstance(layout, str):
            raise PageStoreArgumentError(
                f"host.layout must be a HostLayout or str, got {host.layout!r}"
            )
        return PageFormat(
            layout=layout,
            dtype=str(host.dtype),
            page_size=page_size,
            layer_num=layer_num,
            object_bytes=tuple(int(s) for s in sizes),
            fields=tuple(sorted((name, _json(_canon(v, name))) for name, v in fields.items())),
        )
    except (AttributeError, TypeError) as exc:
        raise PageStoreArgumentError(
            f"host is not an MLAHostPool ({type(host).__name__}): {exc}"
        ) from None
