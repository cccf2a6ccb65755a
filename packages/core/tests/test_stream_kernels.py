"""The streaming copy's kernels (``_stream_code``): each bit-exact where this CPU runs it,
each the bytes its assembly source assembles to, and which one a process maps (the CPU's
flags, ``SGLCORE_STREAM_COPY``)."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sgl_core.transfer.copy import _stream, _stream_table
from sgl_core.transfer.copy._stream_code import AVX2, KERNELS, SSE2, Kernel

X86_LINUX = sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")
FLAGS = _stream.cpu_flags()


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next ``stream_copy()`` load again (and put the process's load back after)."""
    monkeypatch.setattr(_stream, "_loaded", None)


def _mapped(kernel: Kernel) -> Any:
    if not X86_LINUX or (kernel.flag is not None and kernel.flag not in FLAGS):
        pytest.skip(f"this CPU does not run {kernel.name}")
    got = _stream._map_code(ctypes.CDLL(None, use_errno=True), kernel.code)
    if isinstance(got, str):
        pytest.skip(got)
    return got


#: destination offsets (from a 64-byte aligned base) and lengths: 32-byte aligned,
#: 16-byte aligned only (an AVX2 kernel's narrow steps), 8, 1 and 31 bytes off; lengths
#: below, at and past one 64-byte step, a 656-byte DeepSeek-V3.2 row, a 1152-byte MLA row
_OFFSETS = (0, 32, 16, 48, 8, 1, 31)
_LENGTHS = (0, 1, 16, 31, 63, 64, 65, 80, 96, 127, 128, 656, 1152, 4096 + 48, 18432 + 7)


@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_each_kernel_is_bit_exact_over_alignments_and_lengths(kernel: Kernel) -> None:
    """Every (offset, length) pair, each piece in a slot of its own with a gap, sources at
    odd offsets too: every piece lands exactly and no byte outside the pieces moves. More
    than eight triples, so the prefetch of the triple eight ahead runs."""
    gather = _mapped(kernel)
    rng = np.random.default_rng(3)
    slot = 32 << 10
    pairs = [(o, n) for o in _OFFSETS for n in _LENGTHS]
    src = rng.integers(0, 256, len(pairs) * slot + 64, dtype=np.uint8)
    raw = np.zeros(len(pairs) * slot + 128, dtype=np.uint8)
    base = -raw.ctypes.data % 64  # the slots start 64-byte aligned
    dst = raw[base : base + len(pairs) * slot]
    dst[:] = rng.integers(0, 256, dst.size, dtype=np.uint8)
    want = dst.copy()
    ops = []
    for i, (offset, n) in enumerate(pairs):
        at, s = i * slot + offset, i * slot + (i % 5)
        ops.append((dst.ctypes.data + at, src.ctypes.data + s, n))
        want[at : at + n] = src[s : s + n]
    table = _stream_table.ops_table(*zip(*ops, strict=True))
    before = dst.copy()
    gather(table.ctypes.data, 0)  # no triple: nothing moves
    assert np.array_equal(dst, before)
    gather(table.ctypes.data, table.shape[0])
    assert np.array_equal(dst, want)


@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_each_kernel_reads_no_table_entry_past_the_last(kernel: Kernel) -> None:
    """The table's last entry ends where a page the process may not read begins: every
    count from 0 to 19 copies its triples and reads nothing past them (the look-ahead
    to the triple eight ahead stops eight from the end; a read past would fault)."""
    gather = _mapped(kernel)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = libc.mmap(None, 8192, 0x3, 0x22, -1, 0)
    assert page not in (None, ctypes.c_void_p(-1).value)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    try:
        assert libc.mprotect(page + 4096, 4096, 0) == 0  # the second page: no access
        src = np.arange(20 * 64, dtype=np.uint8)
        for n in range(20):
            dst = np.zeros(20 * 64, dtype=np.uint8)
            ops = _stream_table.ops_table(
                [dst.ctypes.data + 64 * i for i in range(n)],
                [src.ctypes.data + 64 * i for i in range(n)],
                [64] * n,
            )
            at = page + 4096 - ops.nbytes  # the table's end touches the guard page
            ctypes.memmove(at, ops.ctypes.data, ops.nbytes)
            gather(at, n)
            assert np.array_equal(dst[: 64 * n], src[: 64 * n]) and not dst[64 * n :].any()
    finally:
        libc.munmap(page, 8192)


@pytest.mark.skipif(shutil.which("as") is None or shutil.which("objcopy") is None, reason="no as")
@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_each_kernel_is_what_its_assembly_source_assembles_to(
    tmp_path: Path, kernel: Kernel
) -> None:
    assert assembled(tmp_path, kernel.asm)[0] == kernel.code


def assembled(tmp_path: Path, asm: str) -> tuple[bytes, Path]:
    """``asm`` through GNU ``as``: its ``.text`` bytes and the object file (skips where
    ``as`` does not target x86-64)."""
    if subprocess.run(["as", "--version"], check=True, capture_output=True).stdout.find(b"x86") < 0:
        pytest.skip("as does not target x86-64")
    src, obj, raw = tmp_path / "g.s", tmp_path / "g.o", tmp_path / "g.bin"
    src.write_text(asm, encoding="ascii")
    subprocess.run(["as", "-o", str(obj), str(src)], check=True)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", str(obj), str(raw)], check=True)
    return raw.read_bytes(), obj


def test_the_kernels_are_listed_by_preference_and_only_sse2_needs_no_flag() -> None:
    assert [k.name for k in KERNELS] == ["avx2", "sse2"]
    assert (AVX2.flag, SSE2.flag) == ("avx2", None)


@pytest.mark.parametrize(
    ("asked", "flags", "want"),
    [
        ("", {"sse2", "avx", "avx2"}, AVX2),
        ("", {"sse2", "avx"}, SSE2),
        ("", set(), SSE2),
        ("1", {"avx2"}, AVX2),  # not a kernel's name: the first the CPU runs
        ("sse2", {"avx2"}, SSE2),
        ("avx2", {"avx2"}, AVX2),
    ],
)
def test_the_first_kernel_the_cpu_runs_is_picked_unless_one_is_named(
    asked: str, flags: set[str], want: Kernel
) -> None:
    assert _stream.pick_kernel(asked, frozenset(flags)) is want


def test_a_named_kernel_the_cpu_does_not_run_is_refused_with_why() -> None:
    why = _stream.pick_kernel("avx2", frozenset({"sse2", "avx"}))
    assert why == f"avx2 asked for ({_stream.ENV_VAR}), and the CPU's flags do not list avx2"


def test_the_flags_are_the_first_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: x avx2 in a name\nflags\t\t: fpu sse2 avx2\n\n"
        "processor\t: 1\nflags\t\t: fpu sse2 avx512f\n",
        encoding="utf-8",
    )
    assert _stream.cpu_flags(info) == {"fpu", "sse2", "avx2"}
    assert _stream.cpu_flags(tmp_path / "missing") == frozenset()
    info.write_text("processor\t: 0\n", encoding="utf-8")
    assert _stream.cpu_flags(info) == frozenset()
    # a byte that is not UTF-8 in another line, and a value holding a colon: read whole
    info.write_bytes(b"model name\t: cpu \xff\xfe\nflags\t\t: fpu a:b avx2\n")
    assert _stream.cpu_flags(info) == {"fpu", "a:b", "avx2"}


def _loading(monkeypatch: pytest.MonkeyPatch, flags: set[str]) -> list[bytes]:
    """``_load`` on an x86-64 Linux CPU with ``flags``, mapping nothing: the code it maps."""
    mapped: list[bytes] = []

    def fake_map(libc: Any, code: bytes) -> Any:
        mapped.append(code)
        return lambda ops, n: None

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(_stream, "cpu_flags", lambda path=None: frozenset(flags))
    monkeypatch.setattr(_stream, "_map_code", fake_map)
    return mapped


@pytest.mark.parametrize(
    ("env", "flags", "want"),
    [
        (None, {"avx2"}, AVX2),
        (None, {"sse4_2"}, SSE2),
        (" SSE2 ", {"avx2"}, SSE2),
        ("on", {"avx2"}, AVX2),
    ],
)
def test_a_process_maps_the_picked_kernel_and_says_which(
    monkeypatch: pytest.MonkeyPatch, fresh: None, env: str | None, flags: set[str], want: Kernel
) -> None:
    if env is None:
        monkeypatch.delenv(_stream.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(_stream.ENV_VAR, env)
    mapped = _loading(monkeypatch, flags)
    assert _stream.stream_copy() is not None
    assert mapped == [want.code]
    assert _stream.stream_copy_status() == f"available ({want.name})"


def test_a_named_kernel_the_cpu_lacks_leaves_the_copy_unavailable(
    monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    monkeypatch.setenv(_stream.ENV_VAR, "avx2")
    mapped = _loading(monkeypatch, {"sse2"})
    assert _stream.stream_copy() is None
    assert mapped == []
    assert _stream.stream_copy_status() == (
        f"unavailable: avx2 asked for ({_stream.ENV_VAR}), and the CPU's flags do not list avx2"
    )
