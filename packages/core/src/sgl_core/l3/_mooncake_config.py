"""How a :class:`~sgl_core.l3.MooncakePageStore` joins Mooncake, and its object keys."""

from __future__ import annotations

import dataclasses

from sgl_core.l3._errors import PageStoreArgumentError
from sgl_core.l3._format import PageFormat

__all__ = ["MooncakeConfig", "mooncake_key"]


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
    ``verify_checksum``: write and check a CRC-32 of every page (see the
    module docstring); pages written without one are misses for a store
    that checks.
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
