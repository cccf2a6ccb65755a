"""Chained page keys: one SHA-256 key per full page of token ids.

Key ``i`` identifies the whole prefix ``tokens[: (i + 1) * page_size]``
(docs/design.md section 8, "Keys").
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import torch

__all__ = ["page_keys"]

_MAX_TOKEN = 2**63 - 1


def _token_list(token_ids: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dim() != 1 or token_ids.dtype.is_floating_point or token_ids.is_complex():
            raise ValueError(
                f"token_ids must be a 1-D integer tensor, got shape {tuple(token_ids.shape)} "
                f"and dtype {token_ids.dtype}"
            )
        values: list[int] = token_ids.detach().to("cpu", torch.int64).tolist()
        return values
    out = []
    for tok in token_ids:
        if isinstance(tok, bool) or not isinstance(tok, int):
            raise ValueError(f"token_ids must hold ints, got {type(tok).__name__}")
        if not -_MAX_TOKEN - 1 <= tok <= _MAX_TOKEN:
            raise ValueError(f"token_ids holds {tok}, outside int64")
        out.append(tok)
    return out


def page_keys(
    token_ids: Sequence[int] | torch.Tensor,
    page_size: int,
    prior_key: str | None = None,
    *,
    namespace: str = "",
    scheme: str = "sgl",
) -> list[str]:
    """Return one key per **full** page of ``token_ids`` (a trailing partial page has none).

    The recipe and ``namespace``: docs/design.md section 8, "Keys"; ``prior_key``
    (the last key of the pages before ``token_ids``) continues a chain, and one
    from another namespace chains to different keys as well.

    ``scheme="sglang"`` produces SGLang's (0.5.23) storage page hashes instead,
    so pages are shared with an SGLang fleet: ``key_i = sha256(digest_{i-1} |
    page i)`` hex encoded, where ``digest_{i-1}`` is the previous key's 32 raw
    bytes (nothing for the first page when ``prior_key`` is None) and page i
    is its tokens as uint32 little-endian, or ``0xff`` then uint64
    little-endian when a token of the page exceeds 2**32 - 1. Tokens must be
    non-negative; ``prior_key`` must be such a 64-hex-digit key and
    ``namespace`` empty (SGLang separates models by its storage backend's key
    suffix, not by the hash).
    """
    if scheme not in ("sgl", "sglang"):
        raise ValueError(f"scheme must be 'sgl' or 'sglang', got {scheme!r}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    if prior_key is not None and not isinstance(prior_key, str):
        raise ValueError(f"prior_key must be a str or None, got {type(prior_key).__name__}")
    tokens = _token_list(token_ids)
    if scheme == "sglang":
        return _sglang_keys(tokens, page_size, prior_key, namespace)
    keys: list[str] = []
    prev = (prior_key or "").encode()
    for p in range(len(tokens) // page_size):
        page = struct.pack(f"<{page_size}q", *tokens[p * page_size : (p + 1) * page_size])
        keys.append(namespace + hashlib.sha256(prev + b"\x00" + page).hexdigest())
        prev = keys[-1].encode()
    return keys


_U32_MAX = 2**32 - 1


def _sglang_keys(
    tokens: list[int], page_size: int, prior_key: str | None, namespace: str
) -> list[str]:
    """SGLang's chained page hashes (see :func:`page_keys`)."""
    if namespace:
        raise ValueError("scheme='sglang' keys carry no namespace; pass namespace=''")
    prev = b""
    if prior_key is not None:
        try:
            prev = bytes.fromhex(prior_key)
        except ValueError:
            prev = b""
        if len(prev) != 32:
            raise ValueError(
                f"prior_key must be an SGLang page hash (64 hex digits), got {prior_key!r}"
            )
    if any(tok < 0 for tok in tokens):
        raise ValueError("scheme='sglang' hashes non-negative token ids only")
    keys: list[str] = []
    for p in range(len(tokens) // page_size):
        page = tokens[p * page_size : (p + 1) * page_size]
        if max(page) > _U32_MAX:  # SGLang marks wide pages with one 0xff byte, then 8-byte tokens
            prev = hashlib.sha256(prev + b"\xff" + struct.pack(f"<{page_size}Q", *page)).digest()
        else:
            prev = hashlib.sha256(prev + struct.pack(f"<{page_size}I", *page)).digest()
        keys.append(prev.hex())
    return keys
