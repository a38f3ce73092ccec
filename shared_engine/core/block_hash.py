"""Prefix-cache keys: each full block's hash chains its parent's hash, its token ids and extra keys.

`hash(block i) = H(hash(block i-1), token ids of block i, extra keys)`, with the extra keys (the LoRA
adapter's identity and version, and the request's `cache_salt`) mixed into the first block so they
propagate down the chain: two requests share block i only if they agree on every token before it and on
adapter and salt. `sha256` (default) over a canonical pickle is stable across processes and collision
resistant; `builtin` (Python's `hash`) is faster but process-local.

`sha256` results are memoised for the most recently hashed blocks: a shared prefix (a system prompt every
request repeats) is hashed once instead of once per request. Memo keys compare by value (token ids are
Python ints), so a hit returns exactly the digest that hashing would.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
from collections.abc import Callable, Sequence

BlockHash = bytes | int
ROOT: BlockHash = b""
_SHA256_MEMO_BLOCKS = 1 << 12  # 64k tokens of prefixes at block size 16; about 4 MB


@functools.lru_cache(maxsize=_SHA256_MEMO_BLOCKS)
def _sha256(value: tuple) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=4)).digest()


def _builtin(value: tuple) -> int:
    return hash(value)


HASH_FUNCTIONS: dict[str, Callable[[tuple], BlockHash]] = {"sha256": _sha256, "builtin": _builtin}


def hash_block(fn: Callable[[tuple], BlockHash], parent: BlockHash, token_ids: Sequence[int],
               extra_keys: tuple | None) -> BlockHash:
    return fn((parent, tuple(token_ids), extra_keys))


def extra_keys_for(lora_name: str | None, lora_version: str | None, cache_salt: str | None) -> tuple | None:
    """The first block's extra keys; None when the request has no adapter and no salt."""
    if lora_name is None and cache_salt is None:
        return None
    return (lora_name, lora_version, cache_salt)
