"""Mooncake page payloads are checksummed: a read that lands on a reused range is a miss.

A read in flight when its object is force-removed (``remove``, ``clear``, a
reader dropping a corrupt page) or when the master restarts can copy from a
range Mooncake already gave to another put: the page header arrives intact,
the payload partly another object's. An in-memory stand-in for the client
returns exactly that, deterministically; ``test_l3_review_race.py`` races it
on a real master.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch
from _l3_helpers import PAGE, raw_page, tokens, torch_host

from sgl_core.l3 import MooncakeConfig, MooncakePageStore, page_keys
from sgl_core.l3._mooncake_lib import OBJECT_ALREADY_EXISTS, OBJECT_NOT_FOUND
from sgl_core.l3._record import HEADER_SIZE


class _Client:
    """Objects as bytes; ``tamper`` flips the last payload byte a get delivers."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.tamper = False

    def setup(self, *_: Any) -> int:
        return 0

    def register_buffer(self, ptr: int, size: int) -> int:
        return 0

    def unregister_buffer(self, ptr: int) -> int:
        return 0

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        return [1 if k in self.objects else 0 for k in keys]

    def batch_put_from_multi_buffers(
        self, keys: Sequence[str], ptrs: Sequence[Sequence[int]], sizes: Sequence[Sequence[int]]
    ) -> list[int]:
        out = []
        for key, ps, ns in zip(keys, ptrs, sizes, strict=True):
            if key in self.objects:
                out.append(OBJECT_ALREADY_EXISTS)
                continue
            self.objects[key] = b"".join(
                ctypes.string_at(p, n) for p, n in zip(ps, ns, strict=True)
            )
            out.append(0)
        return out

    def batch_get_into_multi_buffers(
        self, keys: Sequence[str], ptrs: Sequence[Sequence[int]], sizes: Sequence[Sequence[int]]
    ) -> list[int]:
        out = []
        for key, ps, ns in zip(keys, ptrs, sizes, strict=True):
            data = self.objects.get(key)
            if data is None:
                out.append(OBJECT_NOT_FOUND)
                continue
            if self.tamper:  # the payload's tail now belongs to another object
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            off = 0
            for p, n in zip(ps, ns, strict=True):
                ctypes.memmove(p, data[off : off + n], n)
                off += n
            out.append(off)
        return out

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        return [0 if self.objects.pop(k, None) is not None else OBJECT_NOT_FOUND for k in keys]

    def remove_all(self, force: bool = False) -> int:
        n = len(self.objects)
        self.objects.clear()
        return n

    def close(self) -> int:
        return 0


def _store(client: _Client, verify: bool = True) -> MooncakePageStore:
    """A store on ``client``; checking is the default, so ``verify`` only turns it off."""
    config = MooncakeConfig() if verify else MooncakeConfig(verify_checksum=False)
    return MooncakePageStore(config, client=client)


def test_payload_of_another_object_under_a_good_header_is_a_miss() -> None:
    client = _Client()
    store = _store(client)
    host = torch_host("page_first", seed=31)
    store.register_host_pool(host)
    keys = page_keys(list(range(2 * PAGE)), PAGE, namespace="crc/")
    assert store.batch_set(keys, tokens(2, 2)) == [True, True]
    assert store.batch_get(keys, tokens(5, 2)) == [True, True]
    assert raw_page(host, 5 * PAGE) == raw_page(host, 2 * PAGE)

    before = [raw_page(host, p * PAGE) for p in range(8)]
    client.tamper = True
    assert store.batch_get(keys, tokens(0, 2)) == [False, False]
    assert [raw_page(host, p * PAGE) for p in range(8)] == before  # slots restored
    assert store.stats().errors["corrupt"] == 2
    assert store.batch_exists(keys) == 0  # removed, so it can be stored again


def test_a_page_without_a_checksum_is_a_miss_for_a_checking_store() -> None:
    client = _Client()
    host = torch_host("layer_first", seed=32)
    keys = page_keys(list(range(PAGE)), PAGE, namespace="crc/")
    plain = _store(client, verify=False)
    plain.register_host_pool(host)
    assert plain.batch_set(keys, tokens(1, 1)) == [True]
    key = next(iter(client.objects))
    assert len(client.objects[key]) == HEADER_SIZE + len(raw_page(host, 0))
    checking = _store(client)
    checking.register_host_pool(host)
    assert checking.batch_get(keys, tokens(3, 1)) == [False]
    assert checking.batch_set(keys, tokens(1, 1)) == [True]  # stored again, with a CRC
    assert checking.batch_get(keys, tokens(3, 1)) == [True]
    assert torch.equal(
        host.get_data_page(3 * PAGE).view(torch.int16), host.get_data_page(PAGE).view(torch.int16)
    )


def test_a_batch_call_answering_the_wrong_count_is_a_miss() -> None:
    client = _Client()
    store = _store(client)
    host = torch_host("page_first", seed=33)
    store.register_host_pool(host)
    keys = page_keys(list(range(2 * PAGE)), PAGE, namespace="count/")
    assert store.batch_set(keys, tokens(2, 2)) == [True, True]
    real = client.batch_is_exist
    client.batch_is_exist = lambda k: real(k)[:-1]  # type: ignore[method-assign]
    before = [raw_page(host, p * PAGE) for p in range(8)]
    assert store.batch_exists(keys) == 0
    assert store.batch_get(keys, tokens(0, 2)) == [False, False]
    assert store.batch_set(keys, tokens(4, 2)) == [False, False]
    assert [raw_page(host, p * PAGE) for p in range(8)] == before
    assert store.stats().errors["exception"] == 3
