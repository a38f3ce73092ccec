"""Interleaved KV tiles for split-K decode: split s of S reads tiles s, s + S, s + 2S, ... (BLOCK_N tokens
each) instead of one contiguous run. A contiguous split's first position depends on the context length
(length / S), so a program waits for that load before it can read its block table, then for the block table
before K/V: three dependent rounds. Here the first tile's position is s * BLOCK_N, so its block-table load
is issued beside the context-length load: two rounds. Splits get equal work to within one tile at any length.
Each tile's V load is also issued together with its K load (attend_tile), not after the q.k product.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_tile(
    q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block, pos, valid, head_off, qk_scale, stride_cb, stride_ct,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """Online-softmax (base 2) update of `q` [ROWS, HEAD_DIM] by one tile: positions `pos` [BLOCK_N] in
    blocks `block` (int64), `valid` masking the loads (nothing past the context is read). A tile with no
    valid position leaves (m_i, l_i, acc) as they were (-inf maxima give zero weights, not NaN)."""
    offs_d = tl.arange(0, HEAD_DIM)
    tok_off = block * stride_cb + (pos % BLOCK_SIZE) * stride_ct + head_off  # [BLOCK_N]
    kv_off = tok_off[:, None] + offs_d[None, :]  # [BLOCK_N, HEAD_DIM]
    k = tl.load(k_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(q.dtype)
    # V is loaded before the q.k product, so both tiles are in flight together (the dot's operand staging
    # through shared memory has barriers that keep the compiler from moving a later load above it).
    v = tl.load(v_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k)) * qk_scale  # [ROWS, BLOCK_N]
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def attend_interleaved_tiles(
    q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table_ptr, head_off, split, num_splits, ctx, max_tokens,
    qk_scale, stride_cb, stride_ct, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Tiles split, split + num_splits, ... below `ctx` tokens (none when split >= num_splits: the active
    splits may be fewer than the programs); `max_tokens` (the block table's width in tokens) bounds the
    first tile's block-table load, which does not wait for `ctx`. Returns (m_i, l_i, acc)."""
    offs_n = tl.arange(0, BLOCK_N)
    pos = split * BLOCK_N + offs_n
    block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=pos < max_tokens, other=0).to(tl.int64)
    end = tl.where(split < num_splits, ctx, 0)
    m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block, pos, pos < end, head_off,
                                qk_scale, stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE)
    step = num_splits * BLOCK_N
    for n0 in range((split + num_splits) * BLOCK_N, end, step):
        pos = n0 + offs_n
        valid = pos < end
        block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block, pos, valid, head_off,
                                    qk_scale, stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE)
    return m_i, l_i, acc
