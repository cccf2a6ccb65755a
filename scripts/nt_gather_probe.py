"""Reproduce BENCHMARKS.md's non-temporal gather prototype (issue #27); not shipped code.

A per-layer hicache load of the MLA shape (61 layers x 1152-byte rows, 4096 tokens a call,
random host pages) is replayed four ways and divided by the reference ``sgl-bench`` uses
(the faster of a 1- and a 2-thread contiguous copy of the same bytes), interleaved,
best-of and median:

* ``memmove``: one ``ctypes.memmove`` per contiguous piece (what the shipped by-address
  path does);
* ``nt1-<kernel>`` / ``nt2-<kernel>``: the gather below on one thread, or on this thread
  and one other, once per kernel this CPU runs (``sse2``; ``avx2`` where listed).

The gather is ``void gather(const uint64_t *ops, uint64_t n)`` over ``n`` (dst, src, len)
triples: unaligned loads and non-temporal stores in 64-byte steps (16 bytes at a time in
``sse2``, 32 in ``avx2``) while the destination is aligned for them and 64 bytes or more
remain, ``rep movsb`` for the rest, one ``sfence`` at the end (the shipped kernels,
``_stream_code``). Its machine code is written into an anonymous mapping, which is then
made read+execute (never writable and executable at once), and called through ctypes
(which drops the GIL). ``--check-asm`` re-assembles each kernel's source with GNU ``as``
and compares the bytes. Every run checks each gather's result bit-exact against
memmove's. x86-64 Linux only.

    PYTHONPATH=packages/core/src python scripts/nt_gather_probe.py 64 layer_first 6
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

# the shipped streaming copy's kernels (packages/core/.../copy/_stream_code.py): one source
from sgl_core.transfer.copy._stream import cpu_flags
from sgl_core.transfer.copy._stream_code import KERNELS, Kernel

LAYERS, ROW, TOKENS = 61, 1152, 4096
_PROT_RW, _PROT_RX, _MAP_PRIVATE_ANON = 3, 5, 0x22
Gather = Callable[[int, int], None]
Pieces = list[tuple[int, int, int]]  # (dst, src, len), raw addresses


def check_asm() -> None:
    """Assemble each kernel's source with ``as`` and require its .text to equal its code."""
    if shutil.which("as") is None or shutil.which("objcopy") is None:
        sys.exit("--check-asm needs GNU as and objcopy")
    for kernel in KERNELS:
        with tempfile.TemporaryDirectory() as tmp:
            src, obj, raw = (Path(tmp) / n for n in ("g.s", "g.o", "g.bin"))
            src.write_text(kernel.asm, encoding="ascii")
            subprocess.run(["as", "-o", str(obj), str(src)], check=True)
            cmd = ["objcopy", "-O", "binary", "-j", ".text", str(obj), str(raw)]
            subprocess.run(cmd, check=True)
            if raw.read_bytes() != kernel.code:
                sys.exit(f"{kernel.name}: the code does not match its source")
        print(f"{kernel.name}: the code matches its source")


def load_gather(kernel: Kernel) -> Gather:
    """``kernel``'s code in a page mapped read+write, then switched to read+execute."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = libc.mmap(None, 4096, _PROT_RW, _MAP_PRIVATE_ANON, -1, 0)
    if page in (None, ctypes.c_void_p(-1).value):
        sys.exit(f"mmap failed (errno {ctypes.get_errno()})")
    ctypes.memmove(page, kernel.code, len(kernel.code))
    if libc.mprotect(page, 4096, _PROT_RX) != 0:
        sys.exit(f"mprotect(PROT_EXEC) refused (errno {ctypes.get_errno()})")
    fn: Gather = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)(page)
    return fn


def layer_ops(page: int, layout: str, dev_base: int, host_base: int) -> list[Pieces]:
    """(dst, src, len) pieces of each layer's load of ``TOKENS`` tokens, random pages."""
    count = TOKENS // page
    dev_pages = torch.randperm(2 * TOKENS // page)[:count].tolist()
    host_pages = torch.randperm(4 * TOKENS // page)[:count].tolist()
    layers: list[Pieces] = []
    for layer in range(LAYERS):
        ops: Pieces = []
        for d, h in zip(dev_pages, host_pages, strict=True):
            dst = dev_base + (layer * 2 * TOKENS + d * page) * ROW
            if layout == "page_first":  # host [token][layer][row]: one row per piece
                for t in range(page):
                    ops.append((dst + t * ROW, host_base + ((h * page + t) * LAYERS + layer) * ROW,
                                ROW))  # fmt: skip
            elif layout == "page_first_direct":  # host [page][layer][token][row]
                ops.append((dst, host_base + (h * LAYERS + layer) * page * ROW, page * ROW))
            else:  # layer_first: host [layer][token][row]
                ops.append((dst, host_base + (layer * 4 * TOKENS + h * page) * ROW, page * ROW))
        layers.append(ops)
    return layers


class Helper:
    """One other thread that runs a gather when told (a thread per call costs more)."""

    def __init__(self, gather: Gather) -> None:
        self.gather, self.job = gather, (0, 0)
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.go.acquire()
            self.gather(*self.job)
            self.done.release()


#: per layer: (the table's ctypes array, kept alive; its address; its triples)
Table = tuple[ctypes.Array[ctypes.c_uint64], int, int]


def tables_of(layers: list[Pieces]) -> list[Table]:
    """Each layer's pieces as a (dst, src, len) uint64 table the gather reads."""
    tables = []
    for ops in layers:
        flat = (ctypes.c_uint64 * (3 * len(ops)))(*(x for op in ops for x in op))
        tables.append((flat, ctypes.addressof(flat), len(ops)))
    return tables


def on_one(tables: list[Table], gather: Gather) -> None:
    """Every layer's table on this thread."""
    for _, addr, n in tables:
        gather(addr, n)


def on_two(tables: list[Table], gather: Gather, helper: Helper) -> None:
    """Every layer's table in halves: the second on ``helper``, the first here."""
    for _, addr, n in tables:
        half = n // 2
        helper.job = (addr + 24 * half, n - half)
        helper.go.release()
        gather(addr, half)
        helper.done.acquire()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=int, nargs="?", default=64)
    parser.add_argument("layout", nargs="?", default="layer_first",
                        choices=["layer_first", "page_first", "page_first_direct"])  # fmt: skip
    parser.add_argument("rounds", type=int, nargs="?", default=6)
    parser.add_argument("--check-asm", action="store_true")
    args = parser.parse_args()
    if args.check_asm:
        check_asm()
        return
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        sys.exit("x86-64 Linux only")
    if args.page < 1 or TOKENS % args.page or args.rounds < 2:
        sys.exit(f"page must divide {TOKENS}; rounds >= 2 (the first is a warm-up)")
    flags = cpu_flags()
    gathers = {k.name: load_gather(k) for k in KERNELS if k.flag is None or k.flag in flags}
    torch.manual_seed(0)
    dev = torch.ones(LAYERS, 2 * TOKENS * ROW, dtype=torch.uint8)
    host = torch.randint(0, 256, (4 * TOKENS * LAYERS * ROW,), dtype=torch.uint8)
    layers = layer_ops(args.page, args.layout, dev.data_ptr(), host.data_ptr())
    tables = tables_of(layers)
    scratch = torch.empty(64 << 20, dtype=torch.uint8)
    ref_src = torch.full((TOKENS * LAYERS * ROW,), 3, dtype=torch.uint8)
    ref_dst = torch.empty_like(ref_src)
    helpers = {name: Helper(gather) for name, gather in gathers.items()}

    def memmove() -> None:
        for ops in layers:
            for d, s, n in ops:
                ctypes.memmove(d, s, n)

    def ref1() -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        ref_dst.copy_(ref_src)
        torch.set_num_threads(threads)

    def ref2() -> None:
        ref_dst.copy_(ref_src)

    fns: dict[str, Callable[[], None]] = {"ref1": ref1, "ref2": ref2, "memmove": memmove}
    for name, gather in gathers.items():
        fns[f"nt1-{name}"] = functools.partial(on_one, tables, gather)
        fns[f"nt2-{name}"] = functools.partial(on_two, tables, gather, helpers[name])
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        for name, fn in fns.items():
            scratch.fill_(r)  # evict the caches: a load reads pages nothing touched since
            start = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - start)
    dev.fill_(0)
    memmove()
    expect = dev.clone()
    for name, fn in fns.items():
        if not name.startswith("nt"):
            continue
        dev.fill_(0)
        fn()
        if not torch.equal(dev, expect):
            sys.exit(f"{name}: result differs from memmove")
    best = min(*times["ref1"], *times["ref2"])
    med = min(statistics.median(times["ref1"]), statistics.median(times["ref2"]))
    cells = [
        f"{k} {min(v) * 1e3:.1f} ms {best / min(v):.2f}x/{med / statistics.median(v):.2f}x"
        for k, v in times.items()
    ]
    print(f"{args.layout} page {args.page} (best-of/median vs reference):", "  ".join(cells))


if __name__ == "__main__":
    main()
