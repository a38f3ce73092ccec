"""When a step's decodes run cascade (shared-prefix) attention: the host-side plan for
`kernels/shared_prefix_decode_attention.py`.

Automatic prefix caching gives every request that shares a prompt prefix the same physical blocks, so a
batch of decodes under one system prompt has block tables that begin with one run of identical block ids.
Cascade attention reads that run once per kv head for the whole batch instead of once per sequence
(157 vs 260 µs of decode attention at batch 64, 32/8 heads, head_dim 128, prefix 4096 + suffix 1536-1900
tokens on an H200: `scripts/bench_kernels.py`, `shared_prefix_decode`, at commit ab92c00).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Below these, cascade is not worth its extra kernel launch and merge: vLLM's thresholds (v1 FlashAttention
# backend, `use_cascade_attention`: "arbitrary threshold of 8 queries" and "of 256 tokens"), not yet tuned
# for these kernels. At batch < 8 the plain decode kernel re-reads the prefix only a few times; a prefix under
# 256 tokens is a small share of each sequence's KV.
CASCADE_MIN_DECODES = 8
CASCADE_MIN_PREFIX_TOKENS = 256


def common_prefix_blocks(
    block_tables: np.ndarray,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: Sequence[int],  # [num_seqs], tokens
    block_size: int,
) -> int:
    """The longest run of leading block ids that every row shares, capped so that each sequence keeps at
    least one token after it (prefix tokens < every context length; the prefix is whole blocks).

    Only full blocks of every sequence are compared, so the zero padding of shorter rows never matches."""
    num_seqs = len(context_lens)
    if num_seqs == 0:
        return 0
    limit = (min(context_lens) - 1) // block_size
    if limit <= 0 or num_seqs == 1:
        return max(limit, 0)
    first = block_tables[0, :limit]
    if (block_tables[1:num_seqs, 0] != first[0]).any():  # the common case (no sharing) exits here
        return 0
    same = (block_tables[1:num_seqs, :limit] == first).all(axis=0)  # [limit]
    return limit if same.all() else int(same.argmin())


def cascade_prefix_blocks(
    block_tables: np.ndarray,  # [num_seqs, max_blocks_per_seq] int32, decodes first
    context_lens: Sequence[int],  # [num_seqs], tokens
    num_decodes: int,
    block_size: int,
) -> int:
    """Blocks of the decodes' common prefix when this step should run cascade decode attention, else 0:
    at least CASCADE_MIN_DECODES decodes sharing at least CASCADE_MIN_PREFIX_TOKENS tokens."""
    if num_decodes < CASCADE_MIN_DECODES:
        return 0
    num_blocks = common_prefix_blocks(block_tables[:num_decodes], context_lens[:num_decodes], block_size)
    return num_blocks if num_blocks * block_size >= CASCADE_MIN_PREFIX_TOKENS else 0
