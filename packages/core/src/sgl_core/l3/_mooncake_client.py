"""The Mooncake client side of :class:`~sgl_core.l3.MooncakePageStore`.

Config and object keys, setup, buffer registration, and batch calls whose
exceptions or negative codes become counted errors and a log line (the
store being down is a miss).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from typing import Any

from sgl_core.kv.protocols._kv_protocols import KVHostPool
from sgl_core.l3._format import PageFormat, page_format
from sgl_core.l3._mooncake_lib import error_name, new_store
from sgl_core.l3._pages import StoreState
from sgl_core.l3._protocol import MooncakeSetupError, PageStoreArgumentError, PageStoreNotReadyError
from sgl_core.l3._record import HEADER_SIZE

__all__ = ["MooncakeClient", "MooncakeConfig", "mooncake_key"]

logger = logging.getLogger(__name__)

_SCRATCH_PAGES = 64


def mooncake_key(page_key: str, fmt: PageFormat) -> str:
    """The Mooncake object key of ``page_key`` stored by a pool of format ``fmt``."""
    return f"{page_key}#sglpg2.{fmt.fingerprint}"


@dataclasses.dataclass(frozen=True)
class MooncakeConfig:
    """How a :class:`MooncakePageStore` joins a Mooncake store.

    ``master_server_address``: ``host:port`` of ``mooncake_master``.
    ``metadata_server``: ``"P2PHANDSHAKE"`` (no metadata service; default) or
    a metadata URL such as ``"http://127.0.0.1:8080/metadata"``.
    ``local_hostname``: the address peers reach this client at.
    ``global_segment_size``: bytes this process contributes to the shared
    pool (0: a pure client that stores into other processes' segments).
    ``local_buffer_size``: Mooncake's staging buffer, unused by zero-copy
    calls. ``protocol``: ``"tcp"`` (``"rdma"`` with ``rdma_devices``).
    ``verify_checksum``: write and check a CRC-32 of every page
    (docs/design.md section 8); pages written without one are misses for a
    store that checks. ``restore_on_failed_get``: see ``MooncakePageStore``.
    """

    master_server_address: str = "127.0.0.1:50051"
    metadata_server: str = "P2PHANDSHAKE"
    local_hostname: str = "127.0.0.1"
    protocol: str = "tcp"
    rdma_devices: str = ""
    global_segment_size: int = 0
    local_buffer_size: int = 0
    restore_on_failed_get: bool = True
    verify_checksum: bool = True

    def __post_init__(self) -> None:
        for name in ("global_segment_size", "local_buffer_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PageStoreArgumentError(f"{name} must be an int >= 0, got {value!r}")
        if ":" not in self.master_server_address:
            raise PageStoreArgumentError(
                f"master_server_address must be host:port, got {self.master_server_address!r}"
            )
        if self.protocol not in ("tcp", "rdma"):
            raise PageStoreArgumentError(f"protocol must be 'tcp' or 'rdma', got {self.protocol!r}")


class MooncakeClient(StoreState):
    """A set-up Mooncake client with the host pool's buffers registered (the store's base)."""

    def __init__(self, config: MooncakeConfig, *, client: Any | None = None) -> None:
        self._config = config
        # A MooncakeDistributedStore (tests pass a fake with its calls).
        self._client: Any = client if client is not None else new_store()
        rc = self._client.setup(
            config.local_hostname,
            config.metadata_server,
            config.global_segment_size,
            config.local_buffer_size,
            config.protocol,
            config.rdma_devices,
            config.master_server_address,
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
                try:
                    self._register(int(base), int(total), f"({int(base):#x}, {int(total)})")
                except MooncakeSetupError:
                    self._unregister()
                    raise
                self._registered.append(int(base))
            self._host = host
            self._format = fmt

    def _register(self, addr: int, size: int, what: str) -> None:
        rc = self._client.register_buffer(addr, size)
        if rc != 0:
            raise MooncakeSetupError(
                f"register_buffer{what} failed with {error_name(rc)} ({rc})", rc
            )

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

    def _header_scratch(self, pages: int) -> tuple[int, memoryview]:
        """This thread's registered scratch for ``pages`` page headers: address, byte view."""
        need = pages * HEADER_SIZE
        buf: ctypes.Array[ctypes.c_char] | None = getattr(self._tls, "headers", None)
        if buf is not None and len(buf) >= need:
            return ctypes.addressof(buf), memoryview(buf).cast("B")[:need]
        new = ctypes.create_string_buffer(max(need, _SCRATCH_PAGES * HEADER_SIZE))
        addr = ctypes.addressof(new)
        with self._lock:
            self._check_open()
            self._register(addr, len(new), " of the header scratch")
            self._scratch_regs[addr] = new
            if buf is not None:
                old = ctypes.addressof(buf)
                self._client.unregister_buffer(old)
                self._scratch_regs.pop(old, None)
        self._tls.headers = new
        return addr, memoryview(new).cast("B")[:need]

    def _call(self, what: str, keys: list[str], *args: Any) -> list[int] | None:
        """Run batch call ``what``: one int per key, else ``None`` plus a log line."""
        try:
            result = [int(v) for v in getattr(self._client, what)(keys, *args)]
            problem = None if len(result) == len(keys) else f"answered {len(result)} results"
        except Exception as exc:  # the native client may raise on a lost connection
            problem = f"raised {exc!r}"
        if problem is not None:
            logger.warning("MooncakePageStore: %s(%d keys) %s", what, len(keys), problem)
            self._error("exception")
            return None
        return result

    def _exist_codes(self, obj_keys: list[str]) -> list[int] | None:
        """``batch_is_exist`` codes (none asked for no keys); ``None`` if the call failed."""
        codes = self._call("batch_is_exist", obj_keys) if obj_keys else []
        if codes is None:
            return None
        bad = [c for c in codes if c < 0]
        for c in set(bad):
            self._error(error_name(c), bad.count(c))
        if bad:
            logger.warning(
                "MooncakePageStore: batch_is_exist failed for %d of %d objects (%s)",
                len(bad),
                len(codes),
                error_name(bad[0]),
            )
        return codes
