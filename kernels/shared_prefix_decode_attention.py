"""Shared-prefix ("cascade") decode attention: a decode batch whose sequences all begin with one cached prefix.

When every sequence's block table starts with the same physical blocks (a RAG server's common system
prompt, a prefix cache hit shared by the whole batch), ordinary decode attention reads those blocks once
per sequence. Here the prefix is read once per kv head for the whole batch:

1. prefix: each program loads one split of the prefix's K/V and scores it against the queries of all
   sequences that share its kv head (an M tile of num_seqs x queries_per_kv rows), so the prefix costs
   one [num_seqs x queries_per_kv, head_dim] x [head_dim, tokens] product per tile instead of num_seqs
   small ones, each re-reading the same K/V;
2. suffix: each (sequence, kv head, split) attends to tokens [prefix_len, context_len) through its own
   block table, as in paged_decode_attention;
3. reduce: the partials of both phases merge through their log-sum-exp.

`prefix_len` is a device tensor and every grid depends only on shapes and python ints, so one CUDA graph
capture serves every prefix length. The result equals paged_decode_attention over each whole context (an FP8
cache too, with the same `k_scale` / `v_scale`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._checks import (
    FLOAT_DTYPES,
    check_paged_attention_args,
    check_same_device,
    check_shape,
    check_tensor,
    device_num_sms,
)
from kernels._jit import serving_jit
from kernels.fp8 import KV_CACHE_DTYPES, check_scale
from kernels.paged_decode_attention import (
    attend_paged_kv,
    choose_num_splits,
    paged_decode_attention_ref,
    reduce_splits,
)

MAX_TOTAL_SPLITS = 64  # prefix + suffix splits per row (cascade batches are large: few splits pay)


def shared_prefix_decode_attention_ref(
    q: torch.Tensor,  # [num_seqs, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    prefix_blocks: torch.Tensor,  # [max_prefix_blocks] int32
    prefix_len: torch.Tensor,  # [] or [1] int32, tokens
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_seqs, num_q_heads, head_dim], q.dtype
    """Pure-torch reference: checks the shared-prefix contract (host syncs), then ordinary decode attention.

    Raises ValueError when prefix_len is not a multiple of block_size, exceeds a context length or
    prefix_blocks, or when a block table does not start with prefix_blocks."""
    block_size = k_cache.shape[1]
    n = int(prefix_len.reshape(-1)[0])
    if n % block_size != 0 or n < 0:
        raise ValueError(f"prefix_len must be a non-negative multiple of block_size={block_size}, got {n}")
    if n > prefix_blocks.shape[0] * block_size:
        raise ValueError(f"prefix_len={n} exceeds prefix_blocks ({prefix_blocks.shape[0]} blocks)")
    if q.shape[0] and int(context_lens.min()) < n:
        raise ValueError(f"every context length must be >= prefix_len={n}, got {context_lens.tolist()}")
    nb = n // block_size
    if not torch.equal(block_tables[:, :nb].cpu(), prefix_blocks[:nb].cpu().expand(q.shape[0], nb)):
        raise ValueError(f"block_tables[:, :{nb}] must equal prefix_blocks[:{nb}] for every sequence")
    return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale)


@serving_jit(ints=("num_rows", "total_splits"))
def _prefix_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, prefix_blocks_ptr, prefix_len_ptr, part_out_ptr, part_lse_ptr,
    scale, v_scale, num_rows, total_splits,
    stride_qs, stride_qh, stride_cb, stride_ct, stride_ch,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # M tiles vary fastest, so the programs that read the same K/V split run side by side and share it in L2.
    m_tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    prefix_len = tl.load(prefix_len_ptr)
    # Split length follows this step's prefix_len, so the fixed grid keeps equal work per program; splits
    # past the prefix (a short or empty prefix) run no iteration and store an empty partial.
    split_len = tl.cdiv(tl.cdiv(prefix_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, prefix_len)

    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # row = seq * QUERIES_PER_KV + query head in group
    r_mask = rows < num_rows
    seq = rows // QUERIES_PER_KV
    q_heads = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq[:, None] * stride_qs + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=r_mask[:, None], other=0.0,
    )  # fmt: skip
    qk_scale = scale * 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e))
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    head_off = kv_head * stride_ch
    m_i, l_i, acc = attend_paged_kv(
        q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, prefix_blocks_ptr, head_off, start, end, qk_scale,
        stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
    )  # fmt: skip

    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None] * v_scale  # empty split: zeros, never NaN
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    num_q_heads = tl.num_programs(1) * QUERIES_PER_KV
    row = (seq * num_q_heads + q_heads) * total_splits + split  # prefix splits come first in each row
    tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=r_mask[:, None])
    tl.store(part_lse_ptr + row, lse, mask=r_mask)


@serving_jit(ints=("num_prefix_splits", "total_splits", "stride_bts"))
def _suffix_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, prefix_len_ptr,
    part_out_ptr, part_lse_ptr,
    scale, v_scale, num_prefix_splits, total_splits,
    stride_qs, stride_qh, stride_cb, stride_ct, stride_ch, stride_bts,
    QUERIES_PER_KV: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    prefix_len = tl.load(prefix_len_ptr)
    ctx = tl.load(context_lens_ptr + seq)
    suffix_len = tl.maximum(ctx - prefix_len, 0)
    split_len = tl.cdiv(tl.cdiv(suffix_len, num_splits), BLOCK_N) * BLOCK_N
    start = prefix_len + split * split_len
    end = tl.minimum(start + split_len, ctx)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    q_heads = kv_head * QUERIES_PER_KV + offs_g
    g_mask = offs_g < QUERIES_PER_KV
    q = tl.load(
        q_ptr + seq * stride_qs + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None], other=0.0,
    )  # fmt: skip
    qk_scale = scale * 1.4426950408889634
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bts
    head_off = kv_head * stride_ch
    m_i, l_i, acc = attend_paged_kv(
        q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, head_off, start, end, qk_scale,
        stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
    )  # fmt: skip

    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None] * v_scale
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    num_q_heads = tl.num_programs(1) * QUERIES_PER_KV
    row = (seq * num_q_heads + q_heads) * total_splits + num_prefix_splits + split  # [GROUP_PAD]
    tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=g_mask[:, None])
    tl.store(part_lse_ptr + row, lse, mask=g_mask)


def choose_num_prefix_splits(
    num_m_tiles: int, num_kv_heads: int, max_prefix_len: int, num_suffix_splits: int, num_sms: int = 132
) -> int:
    """Prefix splits: about two programs per SM over (M tile, kv head, split), each split >= 128 tokens of
    `max_prefix_len`, and prefix + suffix splits within MAX_TOTAL_SPLITS (bounds the partial buffers).

    A guess from the decode heuristic, not yet timed on a GPU. Depends only on python ints."""
    programs = max(1, num_m_tiles * num_kv_heads)
    wanted = math.ceil(2 * num_sms / programs)
    by_length = max(1, max_prefix_len // 128)
    return int(max(1, min(wanted, by_length, MAX_TOTAL_SPLITS - num_suffix_splits)))


def _check_prefix_args(prefix_blocks, prefix_len, max_prefix_len, block_size, device) -> None:
    check_tensor("prefix_blocks", prefix_blocks, 1, (torch.int32,))
    if not isinstance(prefix_len, torch.Tensor):
        raise ValueError(
            f"prefix_len must be an int32 device tensor of shape [] or [1] (CUDA-graph replay), "
            f"got {type(prefix_len).__name__}"
        )
    if prefix_len.dtype != torch.int32 or prefix_len.numel() != 1 or prefix_len.dim() > 1:
        raise ValueError(
            f"prefix_len must be an int32 tensor of shape [] or [1], got {prefix_len.dtype} {tuple(prefix_len.shape)}"
        )
    if prefix_blocks.device != device or prefix_len.device != device:
        raise ValueError(
            f"prefix_blocks and prefix_len must be on {device}, got {prefix_blocks.device}, {prefix_len.device}"
        )
    capacity = prefix_blocks.shape[0] * block_size
    if not isinstance(max_prefix_len, int) or not 0 <= max_prefix_len <= capacity:
        raise ValueError(
            f"max_prefix_len must be a python int in [0, {capacity}] (prefix_blocks x block_size), "
            f"got {max_prefix_len!r}"
        )


def shared_prefix_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    prefix_blocks: torch.Tensor,  # [max_prefix_blocks] int32
    prefix_len: torch.Tensor,  # [] or [1] int32, tokens, on q's device
    scale: float,
    out: torch.Tensor | None = None,  # [num_seqs, num_q_heads, head_dim]
    max_prefix_len: int | None = None,
    max_context_len: int | None = None,
    num_prefix_splits: int | None = None,
    num_suffix_splits: int | None = None,
    block_m: int = 64,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_seqs, num_q_heads, head_dim], q.dtype
    """Decode attention of one query token per sequence over `context_lens[s]` cached tokens, where the first
    `prefix_len` tokens of every sequence are the shared blocks `prefix_blocks[:prefix_len // block_size]`.

    Contract, not checked here (it would need host syncs; shared_prefix_decode_attention_ref checks it):
    prefix_len is a multiple of block_size, 0 <= prefix_len <= context_lens[s], and
    block_tables[s, :prefix_len // block_size] == prefix_blocks[:prefix_len // block_size] for every s.
    The result then equals paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale).

    q, k_cache, v_cache share a dtype (fp16, bf16 or fp32), or the caches are float8_e4m3fn (an FP8 KV cache,
    values times `k_scale` / `v_scale`); head_dim is a power of two >= 16, block_size a power of two.
    `max_prefix_len` (tokens, python int, default len(prefix_blocks) * block_size) and
    `max_context_len` (tokens, default max_blocks_per_seq * block_size) only size the grids through the split
    heuristics; a larger prefix_len is still correct. `num_prefix_splits` / `num_suffix_splits` override the
    heuristics; `block_m` is the number of (sequence, query head) rows per prefix program. No host syncs: the
    launch can be captured in a CUDA graph and replayed with new prefix_len / context_lens values.
    Raises ValueError on bad shapes, dtypes, devices or layouts.
    """
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    check_tensor("v_cache", v_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    check_scale("k_scale", k_scale)
    check_scale("v_scale", v_scale)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("context_lens", context_lens, 1, (torch.int32,))
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens)
    num_seqs, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = check_paged_attention_args(q, k_cache, v_cache, block_tables, num_seqs)
    check_shape("context_lens", context_lens, (num_seqs,))
    if max_prefix_len is None:
        max_prefix_len = prefix_blocks.shape[0] * block_size if isinstance(prefix_blocks, torch.Tensor) else 0
    _check_prefix_args(prefix_blocks, prefix_len, max_prefix_len, block_size, q.device)
    if out is None:
        out = torch.empty_like(q)
    check_tensor("out", out, 3, (q.dtype,))
    check_shape("out", out, tuple(q.shape))
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16, got {block_m}")
    if num_seqs == 0:
        return out
    group = num_q_heads // num_kv_heads
    num_rows = num_seqs * group
    num_m_tiles = triton.cdiv(num_rows, block_m)
    num_sms = device_num_sms(q.device)
    if max_context_len is None:
        max_context_len = block_tables.shape[1] * block_size
    if num_suffix_splits is None:
        num_suffix_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, num_sms,
                                              small_batch_programs_per_sm=2, max_splits=MAX_TOTAL_SPLITS)
    if num_prefix_splits is None:
        num_prefix_splits = choose_num_prefix_splits(
            num_m_tiles, num_kv_heads, max_prefix_len, num_suffix_splits, num_sms
        )
    if num_prefix_splits < 1 or num_suffix_splits < 1:
        raise ValueError(f"split counts must be >= 1, got {num_prefix_splits=}, {num_suffix_splits=}")
    if block_n is None:
        block_n = 64 if head_dim <= 128 else 32
    total = num_prefix_splits + num_suffix_splits
    part_out = torch.empty(num_seqs, num_q_heads, total, head_dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(num_seqs, num_q_heads, total, dtype=torch.float32, device=q.device)
    common = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    _prefix_split_kernel[(num_m_tiles, num_kv_heads, num_prefix_splits)](
        q, k_cache, v_cache, prefix_blocks, prefix_len, part_out, part_lse,
        float(scale) * k_scale, float(v_scale), num_rows, total, *common,
        QUERIES_PER_KV=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    _suffix_split_kernel[(num_seqs, num_kv_heads, num_suffix_splits)](
        q, k_cache, v_cache, block_tables, context_lens, prefix_len, part_out, part_lse,
        float(scale) * k_scale, float(v_scale), num_prefix_splits, total, *common, block_tables.stride(0),
        QUERIES_PER_KV=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    reduce_splits(part_out, part_lse, out, total)
    return out
