"""Every exception raised by the sgl packages for bad input or configuration.

Each class also subclasses the built-in exception a caller would naturally
catch (``ValueError``, ``IndexError``, ``TypeError``, ``LookupError``,
``RuntimeError``), so integrations that already catch those keep working.
Messages name the offending argument. Backends raise these classes rather
than defining their own, so callers have one module to import.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousBackendError",
    "ArgumentTypeError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "DeviceError",
    "DuplicateIndexError",
    "FreeError",
    "IndexDTypeError",
    "IndexOutOfRangeError",
    "IndexShapeError",
    "LayerIndexError",
    "PageAlignmentError",
    "PoolMismatchError",
    "PoolSizeError",
    "QuantTypeError",
    "SGLError",
    "ShapeMismatchError",
    "UnsupportedLayoutError",
]


class SGLError(Exception):
    """Base class of every error raised by the sgl packages."""


class ArgumentTypeError(SGLError, TypeError):
    """An argument is not of the type the call takes (e.g. a layer id that is not an int)."""


class IndexDTypeError(SGLError, TypeError):
    """An index argument is not a tensor, or not ``torch.int64``."""


class IndexShapeError(SGLError, ValueError):
    """Index tensors are not 1-D, or paired index tensors differ in length."""


class IndexOutOfRangeError(SGLError, IndexError):
    """An index lies outside the pool it addresses."""


class DuplicateIndexError(SGLError, ValueError):
    """A destination index appears more than once in one transfer."""


class PageAlignmentError(SGLError, ValueError):
    """A page-granular backend got indices that are not whole, aligned pages."""


class LayerIndexError(SGLError, IndexError):
    """A layer id is not in ``[0, layer_num)``."""


class PoolMismatchError(SGLError, ValueError):
    """Two pools (or a pool and tensors) disagree on dims, dtype or kind."""


class UnsupportedLayoutError(SGLError, ValueError):
    """A host layout / io backend pair that the backend does not support."""


class PoolSizeError(SGLError, ValueError):
    """A requested pool size is zero, not whole pages, or exceeds memory."""


class DeviceError(SGLError, ValueError):
    """A ``device`` that names no usable device (a bad string, an int, ``"meta"``),
    or a tensor on a device the call cannot read."""


class FreeError(SGLError, ValueError):
    """Freeing a slot that is out of range or not currently allocated."""


class QuantTypeError(SGLError, ValueError):
    """A quantization type id that the kernel does not implement."""


class ShapeMismatchError(PoolMismatchError):
    """Tensors passed together (or rows passed to a pool) disagree on shape or dtype.

    A subclass of ``PoolMismatchError`` so that ``except PoolMismatchError``
    written for the row accessors before this class was used there still catches it.
    """


class AmbiguousBackendError(SGLError, LookupError):
    """Several device backends are available and ``SGL_BACKEND`` is not set."""


class BackendNotFoundError(SGLError, LookupError):
    """No backend of the requested name is installed."""


class BackendUnavailableError(SGLError, RuntimeError):
    """A backend is installed but cannot run here (no device, no runtime)."""
