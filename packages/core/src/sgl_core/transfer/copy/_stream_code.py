"""The streaming copy's machine code: ``gather(ops, n)`` once per instruction set, each a
:class:`Kernel` with its assembly source (``asm``; ``code`` is what GNU ``as`` makes of it,
and a test re-assembles each where ``as`` is installed). ``_stream`` maps the first of
``KERNELS`` the CPU runs.

Both kernels do the same: for each (dst, src, len) triple, a ``prefetcht1`` (into the
level-2 cache) of the first 2 KiB of the source of the triple eight ahead; non-temporal
stores in 64-byte steps while the destination is aligned for them and 64 or more bytes
remain; ``rep movsb`` for the rest (and for a destination not even 16-byte aligned); one
``sfence`` at the end, so every store is visible before it returns. They differ in the
width of a step's loads and stores: ``sse2`` moves 16 bytes at a time (every x86-64 CPU),
``avx2`` 32 bytes where the destination is 32-byte aligned and 16 (VEX-encoded) where it
is 16-byte aligned only (a 656-byte DeepSeek-V3.2 row), then clears the vector registers'
upper halves (``vzeroupper``), so SSE code that runs after it pays no transition. The
wider steps copied scattered pages measurably faster on the dev VM (BENCHMARKS.md, "AVX2
streaming stores"); so did the level-2 prefetch eight ahead, against a ``prefetcht0``
four ahead (BENCHMARKS.md, "The gather's prefetch").

Only caller-saved registers are used (rdi rsi rdx rcx r8 r9 r11, vector registers 0-3);
the SysV ABI clears the direction flag at every call, so ``rep movsb`` runs forward.
Entry i+8's source is at [r11+200] and its length at [r11+208] (24-byte entries); a
prefetch never faults.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["AVX2", "KERNELS", "Kernel", "SSE2"]


class Kernel(NamedTuple):
    """One build of the gather."""

    name: str  #: what ``SGLCORE_STREAM_COPY`` may ask for and the status names
    flag: str | None  #: the ``/proc/cpuinfo`` flag it needs (None: every x86-64 CPU)
    asm: str
    code: bytes


#: Both kernels' start: the loop over the triples (rdx left; r11 the next one), the
#: prefetch of the first 2 KiB of the source of the triple eight ahead, and one triple
#: read into rdi (dst), rsi (src) and rcx (len); label 9 ends the call
_TRIPLE = """\
    .intel_syntax noprefix
    .globl gather
gather:
    mov r11, rdi
    mov rdx, rsi
    test rdx, rdx
    jz 9f
1:
    cmp rdx, 8
    jbe 4f
    mov r8, [r11+200]
    mov r9, [r11+208]
    cmp r9, 2048
    jbe 5f
    mov r9d, 2048
5:
    prefetcht1 [r8]
    add r8, 64
    sub r9, 64
    ja 5b
4:
    mov rdi, [r11]
    mov rsi, [r11+8]
    mov rcx, [r11+16]
    add r11, 24
"""

SSE2 = Kernel(
    "sse2",
    None,
    _TRIPLE
    + """\
    test dil, 15
    jnz 3f
    cmp rcx, 64
    jb 3f
2:
    movdqu xmm0, [rsi]
    movdqu xmm1, [rsi+16]
    movdqu xmm2, [rsi+32]
    movdqu xmm3, [rsi+48]
    movntdq [rdi], xmm0
    movntdq [rdi+16], xmm1
    movntdq [rdi+32], xmm2
    movntdq [rdi+48], xmm3
    add rsi, 64
    add rdi, 64
    sub rcx, 64
    cmp rcx, 64
    jae 2b
3:
    rep movsb
    dec rdx
    jnz 1b
9:
    sfence
    ret
""",
    bytes.fromhex(
        "4989fb4889f24885d20f848f0000004883fa08762b4d8b83c80000004d8b8bd00000004981f9"
        "00080000760641b900080000410f18104983c0404983e94077f2498b3b498b7308498b4b1049"
        "83c31840f6c70f753e4883f9407238f30f6f06f30f6f4e10f30f6f5620f30f6f5e30660fe707"
        "660fe74f10660fe75720660fe75f304883c6404883c7404883e9404883f94073c8f3a448ffca"
        "0f8571ffffff0faef8c3"
    ),
)

AVX2 = Kernel(
    "avx2",
    "avx2",
    _TRIPLE
    + """\
    cmp rcx, 64
    jb 3f
    test dil, 31
    jnz 6f
2:
    vmovdqu ymm0, [rsi]
    vmovdqu ymm1, [rsi+32]
    vmovntdq [rdi], ymm0
    vmovntdq [rdi+32], ymm1
    add rsi, 64
    add rdi, 64
    sub rcx, 64
    cmp rcx, 64
    jae 2b
    jmp 3f
6:
    test dil, 15
    jnz 3f
7:
    vmovdqu xmm0, [rsi]
    vmovdqu xmm1, [rsi+16]
    vmovdqu xmm2, [rsi+32]
    vmovdqu xmm3, [rsi+48]
    vmovntdq [rdi], xmm0
    vmovntdq [rdi+16], xmm1
    vmovntdq [rdi+32], xmm2
    vmovntdq [rdi+48], xmm3
    add rsi, 64
    add rdi, 64
    sub rcx, 64
    cmp rcx, 64
    jae 7b
3:
    rep movsb
    dec rdx
    jnz 1b
    vzeroupper
9:
    sfence
    ret
""",
    bytes.fromhex(
        "4989fb4889f24885d20f84be0000004883fa08762b4d8b83c80000004d8b8bd00000004981f9"
        "00080000760641b900080000410f18104983c0404983e94077f2498b3b498b7308498b4b1049"
        "83c3184883f940726a40f6c71f7526c5fe6f06c5fe6f4e20c5fde707c5fde74f204883c64048"
        "83c7404883e9404883f94073dceb3e40f6c70f7538c5fa6f06c5fa6f4e10c5fa6f5620c5fa6f"
        "5e30c5f9e707c5f9e74f10c5f9e75720c5f9e75f304883c6404883c7404883e9404883f94073"
        "c8f3a448ffca0f8545ffffffc5f8770faef8c3"
    ),
)

#: by preference: the first one the CPU runs is mapped
KERNELS = (AVX2, SSE2)
