"""``run_l3_bench``: set/get GB/s of L3 page stores beside a plain memory copy.

Defaults follow DeepSeek-V3 MLA: 61 layers, 576 dims, bf16, page 64, so one
page is 61 * 576 * 2 * 64 bytes = 4.5 MB. The host pool comes from the
portable torch backend. Each repeat runs every store (and the memcpy
baseline) in turn, so drifts hit all of them alike; medians are reported.
Every get is checked bit-exact against the source pages.

Mooncake runs only where its listeners cannot be reached from the network
(its client binds every interface, see :mod:`sgl_core.l3._mooncake_lib`): the
default factories start it only in a network namespace with nothing but
loopback and skip it with a note otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from sgl_core.l3._file_store import FilePageStore
from sgl_core.l3._keys import page_keys
from sgl_core.l3._mooncake_lib import isolate_network, master_binary
from sgl_core.l3._mooncake_store import MooncakeConfig, MooncakePageStore
from sgl_core.l3._protocol import PageStore

__all__ = ["default_store_factories", "mooncake_on_loopback", "run_l3_bench"]

StoreFactory = Callable[[], PageStore]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def mooncake_on_loopback(segment_bytes: int) -> Iterator[MooncakeConfig]:
    """Run ``mooncake_master`` on 127.0.0.1 for the ``with`` block.

    Yields a config whose client mounts ``segment_bytes`` itself, so a
    single process is both client and storage (transfers are then local
    copies: the best case for Mooncake's TCP transport). The master binds
    loopback; the *client's* listeners bind every interface, so callers
    isolate the process first (:func:`default_store_factories` does).
    """
    port = _free_port()
    proc = subprocess.Popen(
        [
            master_binary(),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={port}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={_free_port()}",
            "--default_kv_lease_ttl=200",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("mooncake_master did not start") from None
                time.sleep(0.05)
        yield MooncakeConfig(
            master_server_address=f"127.0.0.1:{port}", global_segment_size=segment_bytes
        )
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _mooncake_isolated(notes: list[str]) -> bool:
    """Whether Mooncake can run here, isolated; what was decided is appended to ``notes``."""
    from sgl_core.l3._mooncake_lib import MOONCAKE_INSTALL, mooncake_available

    if not mooncake_available():
        notes.append(
            f"mooncake: skipped, client not installed ({MOONCAKE_INSTALL}; "
            "apt-get install libibverbs1)"
        )
        return False
    isolated, how = isolate_network()
    if isolated:
        notes.append(
            f"mooncake: master and client {how}; its listeners are not reachable "
            "from other machines"
        )
    else:
        notes.append(
            f"mooncake: skipped: {how}; its client listens on every network "
            "interface, so sgl-bench runs it only where nothing but loopback exists"
        )
    return isolated


@contextlib.contextmanager
def default_store_factories(
    page_bytes: int, pages: int, *, notes: list[str] | None = None
) -> Iterator[dict[str, StoreFactory]]:
    """File store in a temp dir, plus Mooncake on loopback when it can run isolated.

    Where it can, this moves the calling process into a private network
    namespace (module docstring). What was decided is appended to ``notes``.
    """
    tmp = Path(tempfile.mkdtemp(prefix="sgl-l3-bench-"))
    try:
        with contextlib.ExitStack() as stack:
            factories: dict[str, StoreFactory] = {
                "file": lambda: FilePageStore(tmp / "file"),
            }
            if _mooncake_isolated(notes if notes is not None else []):
                segment = max(int(page_bytes * pages * 1.5), 64 << 20)
                cfg = stack.enter_context(mooncake_on_loopback(segment))
                # Entered last, so each store closes before the master stops.
                factories["mooncake"] = lambda: stack.enter_context(MooncakePageStore(cfg))
            yield factories
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _memcpy_round(src: list[int], dst: list[int], sizes: list[int]) -> tuple[float, float]:
    """Seconds to copy objects ``src`` into fresh buffers, then those into ``dst``."""
    scratch = [ctypes.create_string_buffer(size) for size in sizes]
    t0 = time.perf_counter()
    for buf, ptr, size in zip(scratch, src, sizes, strict=True):
        ctypes.memmove(buf, ptr, size)
    t1 = time.perf_counter()
    for buf, ptr, size in zip(scratch, dst, sizes, strict=True):
        ctypes.memmove(ptr, buf, size)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def run_l3_bench(
    *,
    page_size: int = 64,
    pages: int = 32,
    layer_num: int = 61,
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "page_first_direct",
    repeats: int = 5,
    notes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Measure set/get GB/s per store and for ``memcpy``; one dict per (store, op).

    The stores are :func:`default_store_factories`'. Each repeat clears the
    store, sets ``pages`` pages from host pages ``[0, pages)`` and gets them
    into ``[pages, 2 * pages)`` (the host pool holds twice the device pool).
    ``notes`` receives one line per decision the factories made (e.g. where
    Mooncake listens).
    """
    import sgl_core

    backend = sgl_core.get_backend("torch")
    dev = backend.create_device_pool(
        size=pages * page_size,
        page_size=page_size,
        dtype=dtype,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        layer_num=layer_num,
    )
    host = backend.create_host_pool(
        dev, layout=layout, host_to_device_ratio=2.0, io_backend="direct"
    )
    src_idx = torch.arange(0, pages * page_size, dtype=torch.int64)
    dst_idx = src_idx + pages * page_size
    gen = torch.Generator().manual_seed(0)
    for p in range(pages):
        flat = host.get_data_page(p * page_size)
        noise = torch.randint(-(2**15), 2**15, flat.shape, generator=gen, dtype=torch.int16)
        host.set_from_flat_data_page(p * page_size, noise.view(flat.dtype))
    src_ptrs, src_sizes = host.get_page_buffer_meta(src_idx)
    dst_ptrs, _ = host.get_page_buffer_meta(dst_idx)
    total = sum(src_sizes)
    keys = page_keys(torch.arange(pages * page_size), page_size, namespace="sgl-l3-bench/")

    with default_store_factories(total // pages, pages, notes=notes) as factories:
        stores = {name: make() for name, make in factories.items()}
        for store in stores.values():
            store.register_host_pool(host)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(repeats):
            t_set, t_get = _memcpy_round(src_ptrs, dst_ptrs, src_sizes)
            times.setdefault(("memcpy", "set"), []).append(t_set)
            times.setdefault(("memcpy", "get"), []).append(t_get)
            for name, store in stores.items():
                store.clear()
                t0 = time.perf_counter()
                ok_set = store.batch_set(keys, src_idx)
                t1 = time.perf_counter()
                ok_get = store.batch_get(keys, dst_idx)
                t2 = time.perf_counter()
                if not all(ok_set) or not all(ok_get):
                    raise RuntimeError(
                        f"{name}: set {ok_set.count(True)}/{pages}, "
                        f"get {ok_get.count(True)}/{pages} pages"
                    )
                for p in range(pages):
                    a = host.get_data_page(p * page_size)
                    b = host.get_data_page((pages + p) * page_size)
                    if not torch.equal(a.view(torch.int16), b.view(torch.int16)):
                        raise RuntimeError(f"{name}: page {p} differs after the round trip")
                times.setdefault((name, "set"), []).append(t1 - t0)
                times.setdefault((name, "get"), []).append(t2 - t1)
        for store in stores.values():
            store.clear()
    rows = []
    for (name, op), samples in times.items():
        med = statistics.median(samples)
        rows.append(
            {
                "store": name,
                "op": op,
                "page_size": page_size,
                "pages": pages,
                "page_bytes": total // pages,
                "bytes": total,
                "repeats": repeats,
                "seconds_median": med,
                "gb_per_s": total / med / 1e9,
            }
        )
    return rows
