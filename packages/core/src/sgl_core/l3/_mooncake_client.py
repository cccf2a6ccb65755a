"""The Mooncake client side of :class:`~sgl_core.l3.MooncakePageStore`.

Setup, registration of the host pool's buffers and of per-thread header
scratch, and the batch-call wrapper that turns a client exception or a
negative code into a counted error and a log line (never an exception: the
store being down is a miss). The page transfers are in ``_mooncake_store``.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from sgl_core.kv.protocols._kv_protocols import KVHostPool
from sgl_core.l3._errors import MooncakeSetupError, PageStoreNotReadyError
from sgl_core.l3._format import page_format
from sgl_core.l3._mooncake_config import MooncakeConfig
from sgl_core.l3._mooncake_lib import StoreClient, error_name
from sgl_core.l3._pages import StoreState
from sgl_core.l3._record import HEADER_SIZE

__all__ = ["MooncakeClient"]

logger = logging.getLogger(__name__)

_SCRATCH_PAGES = 64


class MooncakeClient(StoreState):
    """A set-up Mooncake client with the host pool's buffers registered (the store's base)."""

    def __init__(self, config: MooncakeConfig, *, client: Any | None = None) -> None:
        self._config = config
        self._client: StoreClient = client if client is not None else StoreClient()
        rc = self._client.setup(
            local_hostname=config.local_hostname,
            metadata_server=config.metadata_server,
            global_segment_size=config.global_segment_size,
            local_buffer_size=config.local_buffer_size,
            protocol=config.protocol,
            rdma_devices=config.rdma_devices,
            master_server_addr=config.master_server_address,
        )
        if rc != 0:
            raise MooncakeSetupError(
                f"Mooncake setup failed with {error_name(rc)} ({rc}) for master "
                f"{config.master_server_address!r}, metadata {config.metadata_server!r}",
                rc,
            )
        super().__init__()
        self._registered: list[int] = []
        # Registered header scratch buffers (one per thread), kept alive until close().
        self._scratch_regs: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._closed = False
        self._tls = threading.local()

    @property
    def config(self) -> MooncakeConfig:
        return self._config

    # ------------------------------------------------------------------ setup
    def register_host_pool(self, host: KVHostPool) -> None:
        """Register ``host``'s buffers for zero-copy transfers (replacing a previous pool)."""
        self._check_open()
        fmt = page_format(host)
        bases, totals, _ = host.get_contiguous_buf_infos()
        with self._lock:
            self._unregister()
            for base, total in zip(bases, totals, strict=True):
                rc = self._client.register_buffer(int(base), int(total))
                if rc != 0:
                    self._unregister()
                    raise MooncakeSetupError(
                        f"register_buffer({int(base):#x}, {int(total)}) failed with "
                        f"{error_name(rc)} ({rc})",
                        rc,
                    )
                self._registered.append(int(base))
            self._host = host
            self._format = fmt

    def _unregister(self) -> None:
        for base in self._registered:
            rc = self._client.unregister_buffer(base)
            if rc != 0:
                logger.warning("MooncakePageStore: unregister_buffer(%#x) -> %d", base, rc)
        self._registered.clear()
        self._host = None
        self._format = None

    def _check_open(self) -> None:
        if self._closed:
            raise PageStoreNotReadyError("this MooncakePageStore is closed")

    def _header_scratch(self, pages: int) -> int:
        """Address of this thread's registered scratch for ``pages`` page headers."""
        need = pages * HEADER_SIZE
        buf: ctypes.Array[ctypes.c_char] | None = getattr(self._tls, "headers", None)
        if buf is not None and len(buf) >= need:
            return ctypes.addressof(buf)
        new = ctypes.create_string_buffer(max(need, _SCRATCH_PAGES * HEADER_SIZE))
        addr = ctypes.addressof(new)
        with self._lock:
            self._check_open()
            rc = self._client.register_buffer(addr, len(new))
            if rc != 0:
                raise MooncakeSetupError(
                    f"register_buffer of the header scratch failed with {error_name(rc)} ({rc})",
                    rc,
                )
            self._scratch_regs[addr] = new
            if buf is not None:
                old = ctypes.addressof(buf)
                self._client.unregister_buffer(old)
                self._scratch_regs.pop(old, None)
        self._tls.headers = new
        return addr

    def _count_error(self, code: int, n: int = 1) -> None:
        self._error(error_name(code), n)

    def _call(self, what: str, fn: Any, *args: Any) -> list[int] | None:
        """Run a batch call; an exception from the client becomes ``None`` plus a log line."""
        try:
            result: list[int] = fn(*args)
        except Exception as exc:  # the native client may raise on a lost connection
            logger.warning("MooncakePageStore: %s raised %r", what, exc)
            self._error("exception")
            return None
        return result

    def _exist_codes(self, obj_keys: list[str]) -> list[int] | None:
        codes = self._call("batch_is_exist", self._client.batch_is_exist, obj_keys)
        if codes is None:
            return None
        bad = [c for c in codes if c < 0]
        for c in set(bad):
            self._count_error(c, bad.count(c))
        if bad:
            logger.warning(
                "MooncakePageStore: batch_is_exist failed for %d of %d objects (%s)",
                len(bad),
                len(codes),
                error_name(bad[0]),
            )
        return codes
