"""The host mirror of a per-layer pool's indexer cache (token-row host layouts;
docs/design.md section 5a, "DeepSeek-V3.2 rows").

The indexer moves with the KV: :class:`IndexerMover` wraps the io backend's
KV mover, so there is one copy engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from sgl_core.errors import PoolMismatchError
from sgl_core.kv._validation import check_backed
from sgl_core.kv.device._indexer import IndexerConfig, indexer_of
from sgl_core.kv.protocols._kv_protocols import DevicePoolGeometry, MLADevicePool
from sgl_core.transfer._transfer import Mover, Transfer

__all__ = ["IndexerMover", "check_device_indexer"]

_NAMES = ("index_k_buffer", "index_k_scale_buffer")


def check_device_indexer(
    device_pool: DevicePoolGeometry, expected: IndexerConfig | None, dtype: torch.dtype
) -> list[torch.Tensor]:
    """``PoolMismatchError`` unless the device pool's indexer is ``expected``; its tensors.

    Checks the configuration first, then every per-slot tensor's shape,
    dtype, device and storage (they are plain list items: one may have been
    replaced since the pool was built).
    """
    theirs = indexer_of(device_pool)
    if theirs != expected:
        raise PoolMismatchError(
            "device_pool indexer (index_head_dim, indexer_layer_ids, has_index_k_scale) = "
            f"{_describe(theirs)}, expected {_describe(expected)}"
        )
    if expected is None:
        return []
    slots = device_pool.size + device_pool.page_size
    found: list[torch.Tensor] = []
    specs = [(_NAMES[0], expected.index_head_dim, dtype)]
    if expected.with_scale:
        specs.append((_NAMES[1], 1, torch.float32))
    for name, dim, want in specs:
        tensors = getattr(device_pool, name, None)
        if not isinstance(tensors, list) or len(tensors) != len(expected.layer_ids):
            raise PoolMismatchError(
                f"device_pool.{name} must be a list of {len(expected.layer_ids)} tensors"
            )
        for i, t in enumerate(tensors):
            if (
                not isinstance(t, torch.Tensor)
                or tuple(t.shape) != (slots, 1, dim)
                or t.dtype != want
                or t.device != device_pool.device
            ):
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t)
                raise PoolMismatchError(
                    f"device_pool.{name}[{i}] must be a {(slots, 1, dim)} {want} tensor on "
                    f"{device_pool.device}, got {got}"
                )
            check_backed(t, f"device_pool.{name}[{i}]")
            found.append(t)
    return found


def _describe(cfg: IndexerConfig | None) -> object:
    return None if cfg is None else (cfg.index_head_dim, cfg.layer_ids, cfg.with_scale)


class IndexerPart(Protocol):
    """Moves indexer rows: every slot on backup, one layer's (or one slot's) on load."""

    def backup(self, transfer: Transfer) -> None: ...

    def load(self, transfer: Transfer, layer_id: int) -> None: ...


class IndexerMover:
    """An io backend's KV mover plus the movers of the indexer components.

    The parts are the core direct mover over the indexer's token rows (it
    maps a layer to its slot itself: ``slot_of`` None), or movers of an
    engine's indexer pages (``sgl_core.kv.device._paged_indexer.PagedIndexerPart``),
    which take the slot ``slot_of`` gives. The parts move first, on the same
    stream, so a KV mover that records the point after its transfer (the
    cuda backend's ``StreamFence``) covers them.
    """

    def __init__(
        self,
        kv: Mover,
        parts: Sequence[IndexerPart],
        slot_of: Callable[[int], int | None] | None,
    ) -> None:
        self.kv = kv
        self.parts = parts
        self.slot_of = slot_of

    def check(self, device_pool: MLADevicePool) -> None:
        self.kv.check(device_pool)

    def synchronize(self) -> None:
        self.kv.synchronize()

    def backup(self, transfer: Transfer) -> None:
        for part in self.parts:
            part.backup(transfer)
        self.kv.backup(transfer)

    def load(self, transfer: Transfer, layer_id: int) -> None:
        slot = layer_id if self.slot_of is None else self.slot_of(layer_id)
        if slot is not None:
            for part in self.parts:
                part.load(transfer, slot)
        self.kv.load(transfer, layer_id)
