"""The streaming team's machine code (``_stream_team``): three entry points in one page,
with their assembly source (``TEAM.asm``; ``TEAM.code`` is what GNU ``as`` makes of it,
and a test re-assembles it where ``as`` is installed). It calls the streaming gather
(``_stream_code``) through the box, so one build serves every gather kernel.

The box is seven 8-byte words: ``work`` (the generation in the high half, the next part
to take in the low half), ``done`` (parts finished), ``ops`` (the table's address),
``bounds`` (the address of ``parts + 1`` uint64 entry indices: part i is entries
``[bounds[i], bounds[i+1])``), ``parts``, ``threads`` (the seats of this call: the lead
is seat 0, helper k joins only while k < threads) and ``gather`` (the gather's address).

* ``lead(box, ops, bounds, parts, threads, pauses) -> 0 | 1``: closes the work word (the
  old generation with no part left: a helper half-way through a claim of the old one
  then fails its compare-and-swap, whatever it read after), writes the call, zeroes
  ``done``, opens the next generation at part 0, takes parts itself, then waits as
  ``wait`` does.
* ``wait(box, pauses) -> 0 | 1``: 0 once ``done`` reaches ``parts``, 1 after ``pauses``
  ``pause`` instructions without that (the caller sleeps a little and asks again).
* ``serve(box, seen, pauses, seat) -> generation``: a helper spins (``pause``) until the
  work word shows a generation other than ``seen``, takes its parts while any is left
  (if its seat is in the call), and spins again; after ``pauses`` pauses without a new
  generation it returns the last one it saw (the caller sleeps until woken).
* Taking a part (``claim``): read the work word; stop if its generation is not this
  one's or no part is left; else a ``lock cmpxchg`` of the word to the next part, then
  ``gather(ops + 24 * bounds[i], bounds[i+1] - bounds[i])`` and a ``lock inc`` of
  ``done``. The gather ends with ``sfence``, so every streaming store of a part is
  visible before ``done`` counts it; x86's ordered stores make the lead's writes of the
  call visible before the generation that opens it.

``lead`` never waits for a helper that has not started: a part nobody has taken is taken
by the lead. Only callee-saved registers (rbx, r12-r15) hold state across the gather,
which uses caller-saved ones only.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BOX_WORDS", "TEAM", "TeamCode"]

#: the box's length in 8-byte words
BOX_WORDS = 7


class TeamCode(NamedTuple):
    """The team's build and its entry points' offsets in the code."""

    asm: str
    code: bytes
    lead: int
    wait: int
    serve: int


TEAM = TeamCode(
    """\
    .intel_syntax noprefix
    .globl lead, wait, serve
lead:
    push rbx
    push r12
    push r13
    mov rbx, rdi
    mov r12, r9
    mov rax, [rbx]
    mov r10d, 0xffffffff
    or rax, r10
    mov [rbx], rax
    mov [rbx+16], rsi
    mov [rbx+24], rdx
    mov [rbx+32], rcx
    mov [rbx+40], r8
    mov qword ptr [rbx+8], 0
    shr rax, 32
    inc eax
    shl rax, 32
    mov [rbx], rax
    mov r13, rax
    call claim
    jmp 1f
    .p2align 6
wait:
    push rbx
    push r12
    push r13
    mov rbx, rdi
    mov r12, rsi
1:
    mov rax, [rbx+8]
    cmp rax, [rbx+32]
    jae 2f
    test r12, r12
    jz 3f
    dec r12
    pause
    jmp 1b
2:
    xor eax, eax
    jmp 4f
3:
    mov eax, 1
4:
    pop r13
    pop r12
    pop rbx
    ret
    .p2align 6
serve:
    push rbx
    push r12
    push r13
    push r14
    push r15
    mov rbx, rdi
    mov r13, rsi
    shl r13, 32
    mov r12, rdx
    mov r14, rcx
5:
    mov r15, r12
6:
    mov rax, [rbx]
    mov rdx, rax
    xor rdx, r13
    shr rdx, 32
    jnz 7f
    test r15, r15
    jz 8f
    dec r15
    pause
    jmp 6b
7:
    shr rax, 32
    shl rax, 32
    mov r13, rax
    cmp r14, [rbx+40]
    jae 5b
    call claim
    jmp 5b
8:
    mov rax, r13
    shr rax, 32
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbx
    ret
    .p2align 6
claim:
    push r14
9:
    mov rax, [rbx]
    mov rdx, rax
    xor rdx, r13
    shr rdx, 32
    jnz 10f
    mov ecx, eax
    cmp rcx, [rbx+32]
    jae 10f
    lea rdx, [rax+1]
    lock cmpxchg [rbx], rdx
    jne 9b
    mov r14, [rbx+24]
    mov rdi, [r14+rcx*8]
    mov rsi, [r14+rcx*8+8]
    sub rsi, rdi
    lea rdi, [rdi+rdi*2]
    shl rdi, 3
    add rdi, [rbx+16]
    call [rbx+48]
    lock inc qword ptr [rbx+8]
    jmp 9b
10:
    pop r14
    ret
""",
    bytes.fromhex(
        "53415441554889fb4d89cc488b0341baffffffff4c09d0488903488973104889531848894b20"
        "4c89432848c743080000000048c1e820ffc048c1e0204889034989c5e8f9000000eb4266662e"
        "0f1f84000000000066662e0f1f84000000000066662e0f1f84000000000066662e0f1f840000"
        "00000066662e0f1f84000000000053415441554889fb4989f4488b4308483b4320730c4d85e4"
        "740b49ffccf390ebea31c0eb05b801000000415d415c5bc366662e0f1f8400000000000f1f44"
        "00005341544155415641574889fb4989f549c1e5204989d44989ce4d89e7488b034889c24c31"
        "ea48c1ea20750c4d85ff741f49ffcff390ebe548c1e82048c1e0204989c54c3b732873d1e833"
        "000000ebca4c89e848c1e820415f415e415d415c5bc366662e0f1f84000000000066662e0f1f"
        "840000000000662e0f1f8400000000004156488b034889c24c31ea48c1ea20753989c1483b4b"
        "207331488d5001f0480fb11375de4c8b7318498b3cce498b74ce084829fe488d3c7f48c1e703"
        "48037b10ff5330f048ff4308ebb8415ec3"
    ),
    0x00,
    0x80,
    0xC0,
)
