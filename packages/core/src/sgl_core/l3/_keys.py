"""Chained page keys: one SHA-256 key per full page of token ids.

Key ``i`` hashes the previous key and page ``i``'s tokens, so key ``i``
identifies the whole prefix ``tokens[: (i + 1) * page_size]``. Two requests
that share a prefix share its keys, and "how many keys exist from the start"
(:meth:`PageStore.batch_exists`) is the cached prefix length in pages.
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
) -> list[str]:
    """Return one key per **full** page of ``token_ids`` (a trailing partial page has none).

    ``key_i = namespace + sha256(key_{i-1} | 0x00 | int64-le tokens of page i)``,
    hex encoded; ``key_{-1}`` is ``prior_key`` (the last key of the pages before
    ``token_ids``, to continue a chain) or the empty string. ``namespace`` (a
    model name, a tenant, ...) prefixes every key, so stores shared by several
    models never mix their pages; a ``prior_key`` from another namespace chains
    to different keys as well.
    """
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    if prior_key is not None and not isinstance(prior_key, str):
        raise ValueError(f"prior_key must be a str or None, got {type(prior_key).__name__}")
    tokens = _token_list(token_ids)
    pages = len(tokens) // page_size
    prev = (prior_key or "").encode()
    keys: list[str] = []
    fmt = f"<{page_size}q"
    for p in range(pages):
        digest = hashlib.sha256(prev)
        digest.update(b"\x00")
        digest.update(struct.pack(fmt, *tokens[p * page_size : (p + 1) * page_size]))
        key = namespace + digest.hexdigest()
        keys.append(key)
        prev = key.encode()
    return keys
