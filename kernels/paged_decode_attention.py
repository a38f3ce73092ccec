"""Paged decode attention: one new query token per sequence against its paged KV cache.

Split-K "flash-decoding": each program handles one (sequence, kv head, split) and all the query heads
that share that kv head (GQA), so every K/V byte is read from memory once. With more than one split, the
per-split partial outputs are merged through their log-sum-exp either by the split kernel's own last
program per (sequence, kv head) (the default: one launch, kernels/split_k_finish.py) or by a second kernel,
one program per (sequence, query head, 32 of head_dim). At small batch and long context (batch 1-4 x 8 kv
heads at 16k-128k tokens on 132 SMs) the heuristic splits into about 8 programs per SM
(`choose_num_splits`). The grid depends only on shapes and python ints, so the launcher is safe to capture
in a CUDA graph. An FP8 (e4m3) cache is read with per-tensor `k_scale` / `v_scale` (kernels/fp8.py).
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
    is_power_of_two,
)
from kernels._jit import serving_jit
from kernels.fp8 import KV_CACHE_DTYPES, check_scale, read_cache
from kernels.interleaved_kv_tiles import attend_interleaved_tiles
from kernels.split_k_finish import COUNTER_SLOTS, last_split_merges, split_counters


def gather_paged_kv(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks_per_seq] int32
    length: int,
) -> torch.Tensor:  # [length, num_kv_heads, head_dim]
    """The first `length` tokens of one sequence, gathered through its block table (an FP8 cache through a
    uint8 view: indexing kernels need not support float8)."""
    block_size = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    blocks = block_table.long()[pos // block_size]
    raw = cache.view(torch.uint8) if cache.dtype == torch.float8_e4m3fn else cache
    return raw[blocks, pos % block_size].view(cache.dtype)


def paged_decode_attention_ref(
    q: torch.Tensor,  # [num_seqs, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_seqs, num_q_heads, head_dim], q.dtype
    """Pure-torch reference: gather each sequence's K/V (an FP8 cache dequantised with k_scale / v_scale),
    softmax attention in fp32."""
    num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        n = int(context_lens[s])
        k = read_cache(gather_paged_kv(k_cache, block_tables[s], n), k_scale).repeat_interleave(group, dim=1)
        v = read_cache(gather_paged_kv(v_cache, block_tables[s], n), v_scale).repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[s].float(), k) * scale  # [num_q_heads, n]
        out[s] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v).to(q.dtype)
    return out


@triton.jit
def attend_paged_kv(
    q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table_ptr, head_off, start, end, qk_scale,
    stride_cb, stride_ct, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Online-softmax (base 2) update of rows `q` [ROWS, HEAD_DIM] over KV positions [start, end), read
    through the block ids at `table_ptr` (one per BLOCK_SIZE tokens). K/V are cast to q's dtype (an FP8
    cache: exact; its scales are the caller's, in qk_scale and on the output). Returns (m_i, l_i, acc)."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        valid = pos < end
        block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        tok_off = block * stride_cb + (pos % BLOCK_SIZE) * stride_ct + head_off  # [BLOCK_N]
        kv_off = tok_off[:, None] + offs_d[None, :]  # [BLOCK_N, HEAD_DIM]
        k = tl.load(k_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [ROWS, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return m_i, l_i, acc


@serving_jit(ints=("num_splits", "stride_bts", "max_tokens", "min_split_tokens"))
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, counters_ptr,
    scale, v_scale, num_splits, max_tokens, min_split_tokens,
    stride_qs, stride_qh, stride_cb, stride_ct, stride_ch, stride_bts, stride_os, stride_oh,
    QUERIES_PER_KV: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT_OUT: tl.constexpr,
    FUSED_REDUCE: tl.constexpr, Q_PAD: tl.constexpr, REDUCE_TILE: tl.constexpr, INTERLEAVE: tl.constexpr,
    MERGE_2D: tl.constexpr, PDL: tl.constexpr, DOT_F16: tl.constexpr,
):  # fmt: skip
    if PDL:  # launched while the previous kernel ends: wait for its writes (q, the KV cache), then let the
        tl.extra.cuda.gdc_wait()  # reduce kernel (if any) launch early; it waits for this one in turn
        tl.extra.cuda.gdc_launch_dependents()
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq)
    # Splits that read KV: one per min_split_tokens of this sequence's length, 1..num_splits; the others
    # store an empty partial (and, fused, count their ticket).
    active = tl.minimum(tl.maximum(tl.cdiv(ctx, min_split_tokens), 1), num_splits)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    q_heads = kv_head * QUERIES_PER_KV + offs_g
    g_mask = offs_g < QUERIES_PER_KV
    q = tl.load(
        q_ptr + seq * stride_qs + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None], other=0.0,
    )  # fmt: skip
    if DOT_F16:  # K/V tiles follow q's dtype (attend_paged_kv): e4m3 -> fp16, the dots in fp16
        q = q.to(tl.float16)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e))
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bts
    head_off = kv_head * stride_ch
    if INTERLEAVE:  # tiles split, split + active, ...: kernels/interleaved_kv_tiles.py
        m_i, l_i, acc = attend_interleaved_tiles(
            q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, head_off, split, active, ctx, max_tokens,
            qk_scale, stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
        )  # fmt: skip
    else:
        # Contiguous splits divide this sequence's own length, so every program of a sequence gets equal work.
        split_len = tl.cdiv(tl.cdiv(ctx, active), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = tl.minimum(start + split_len, ctx)
        m_i, l_i, acc = attend_paged_kv(
            q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, head_off, start, end, qk_scale,
            stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
        )  # fmt: skip

    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None] * v_scale  # empty split or context: zeros, never NaN
    if DIRECT_OUT:
        o_ptrs = out_ptr + seq * stride_os + q_heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        row = (seq * (QUERIES_PER_KV * tl.num_programs(1)) + q_heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=g_mask[:, None])
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)
        if FUSED_REDUCE:  # the last split program of this (sequence, kv head) merges all of them
            first_head = kv_head * QUERIES_PER_KV
            last_split_merges(
                counters_ptr + seq * tl.num_programs(1) + kv_head, part_out_ptr, part_lse_ptr,
                out_ptr + seq * stride_os + first_head * stride_oh,
                (seq * (QUERIES_PER_KV * tl.num_programs(1)) + first_head) * num_splits, num_splits, active,
                stride_oh, QUERIES_PER_KV, Q_PAD, HEAD_DIM, REDUCE_TILE, MERGE_2D,
            )  # fmt: skip


@serving_jit(ints=("num_splits",))
def _decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, num_splits, stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_TILE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """One program per (sequence, query head, BLOCK_D slice of head_dim): at batch 1 with 32 query heads and
    head_dim 128 that is 128 programs, most of the 132 SMs, where one program per head used 32. One pass over
    the splits, SPLITS_TILE at a time with an online log-sum-exp (a single tile up to MAX_SPLITS: the partial
    outputs and their lse are loaded together, one round of loads; any split count, one compile)."""
    if PDL:  # launched before the split kernel ends (programmatic dependent launch): wait for its partials
        tl.extra.cuda.gdc_wait()
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row0 = (seq * tl.num_programs(1) + head) * num_splits
    offs_s = tl.arange(0, SPLITS_TILE)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    m = tl.max(tl.full([SPLITS_TILE], float("-inf"), dtype=tl.float32), 0)  # running max lse (log2 domain)
    total = tl.sum(tl.zeros([SPLITS_TILE], dtype=tl.float32), 0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, num_splits, SPLITS_TILE):
        s_mask = s0 + offs_s < num_splits
        lse = tl.load(part_lse_ptr + row0 + s0 + offs_s, mask=s_mask, other=float("-inf"))
        part = tl.load(part_out_ptr + (row0 + s0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                       mask=s_mask[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # every split so far empty: weights 0, not NaN
        rescale = tl.exp2(m - m_ref)
        w = tl.exp2(lse - m_ref)  # [SPLITS_TILE], 0 for empty splits
        acc = acc * rescale + tl.sum(part * w[:, None], 0)
        total = total * rescale + tl.sum(w, 0)
        m = m_new
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def reduce_splits(
    part_out: torch.Tensor,  # [num_seqs, num_q_heads, num_splits, head_dim] fp32
    part_lse: torch.Tensor,  # [num_seqs, num_q_heads, num_splits] fp32, log2 domain (-inf: empty split)
    out: torch.Tensor,  # [num_seqs, num_q_heads, head_dim], rows strided, head_dim contiguous
    num_splits: int,
    pdl: bool = False,
) -> None:
    """Merge per-split partial outputs into `out` (the second kernel of split-K decode attention). `pdl`:
    launch it as a programmatic dependent launch (Hopper; Triton's launch_pdl) that waits in-kernel."""
    num_seqs, num_q_heads, head_dim = out.shape
    block_d = min(head_dim, 32)
    _decode_reduce_kernel[(num_seqs, num_q_heads, head_dim // block_d)](
        part_out, part_lse, out, num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, SPLITS_TILE=MAX_SPLITS, num_warps=4, PDL=pdl,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip


# The heuristic's largest split count (a 128k-token context at batch 1 on 132 SMs asks for 132).
MAX_SPLITS = 256
# Below one program per SM (batch * kv heads < SMs: batch 1-16 with 8 kv heads), split until about this many
# programs per SM: the shared memory of 3 pipeline stages of K and V tiles keeps about two resident per SM,
# so the rest queue behind them and every SM stays busy to the end instead of a few long programs bounding
# the kernel (32 splits at batch 1, 16k tokens, read KV at 31% of copy bandwidth, KERNEL_NOTES.md run 2).
SMALL_BATCH_PROGRAMS_PER_SM = 8
MIN_SPLIT_TOKENS = 128  # two BLOCK_N tiles
# Merge the splits in the split kernel (its last program per sequence and kv head) rather than in a second
# kernel: one launch instead of two, no kernel boundary between them (issue 21: batch 1 at 16k paid ~10 us
# of fixed cost per call with two). OFF by default: on the H200 at c518670 the fused path hit an illegal memory
# access in scripts/bench_decode_long.py and its counter test failed (benchmarks/results/
# decode_kernel_tests_h200_c518670.log, bench_decode_long_h200_c518670.log); the two-kernel merge stays the
# served path until a GPU run passes.
FUSE_REDUCE = False
# Over an FP8 cache and a bf16 q, cast q and the e4m3 K/V tiles to fp16 rather than bf16 (exact either way: e4m3
# has 3 mantissa bits and a range inside fp16's) and run the dots in fp16: sm_89+/sm_90 convert e4m3 pairs to
# fp16 in one instruction, to bf16 only through wider types. The prefill kernel's same option (fp8_f16) was
# 16-26% faster over FP8 caches on the H200 at 9a99c62; FP8 KV decode ran at 38.7% of its bound at 1,000 / 1,000
# on an H100 at c6876ad against bf16's 65.1%. fp16 tops out at 65504, so a q entry beyond it (bf16 reaches 3.4e38)
# would become inf and the row NaN: attention queries after RMSNorm and the q projection sit far below, but the
# cast is not checked. OFF until scripts/bench_decode_fp8.py has timed it on a GPU.
FP8_DOT_F16 = False


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int = 132,
                      small_batch_programs_per_sm: int = SMALL_BATCH_PROGRAMS_PER_SM,
                      max_splits: int = MAX_SPLITS) -> int:
    """Splits per sequence, each >= MIN_SPLIT_TOKENS: about two programs per SM when seqs * kv_heads fills
    the SMs, else about SMALL_BATCH_PROGRAMS_PER_SM (batch 1 x 8 kv heads on the H200: 128 splits at 16k
    tokens, 132 at 32k-128k; batch 4: 33).

    On the H200 (132 SMs), batch 64 x 8 kv heads ran fastest unsplit at 1k-16k tokens (see
    benchmarks/KERNEL_NOTES.md); splits pay when seqs * kv_heads is small next to the SM count.

    Depends only on python ints, so a CUDA graph captured for a batch shape stays valid (graphs pass
    max_model_len: a shorter context leaves the trailing splits empty, which cost a store each). Cascade
    decode (shared_prefix_decode_attention.py) keeps two per SM and at most 64 for its suffix splits.
    """
    programs = max(1, num_seqs * num_kv_heads)
    per_sm = 2 if programs >= num_sms else small_batch_programs_per_sm
    wanted = math.ceil(per_sm * num_sms / programs)
    by_length = max(1, max_context_len // MIN_SPLIT_TOKENS)
    return int(max(1, min(wanted, by_length, max_splits)))


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    out: torch.Tensor | None = None,  # [num_seqs, num_q_heads, head_dim]
    num_splits: int | None = None,
    max_context_len: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fuse_reduce: bool | None = None,
    reduce_tile: int = 32,
    counters: torch.Tensor | None = None,
    interleave: bool = False,
    min_split_tokens: int = 1,
    merge_2d: bool = False,
    pdl: bool = False,
    fp8_f16: bool | None = None,
) -> torch.Tensor:  # [num_seqs, num_q_heads, head_dim], q.dtype
    """Attention of one query token per sequence over `context_lens[s]` cached tokens (tokens 0..n-1).

    q, k_cache, v_cache share a dtype (fp16, bf16 or fp32), or the caches are float8_e4m3fn (an FP8 KV
    cache, values times `k_scale` / `v_scale`: positive python floats, 1.0 otherwise); head_dim is a power
    of two >= 16 and block_size a power of two >= 1. `scale` multiplies q.k (usually head_dim ** -0.5). `num_splits`
    overrides the split-K heuristic, which uses `max_context_len` (tokens, a python int; default
    max_blocks_per_seq * block_size). No host syncs: safe under CUDA graph capture.

    With more than one split, `fuse_reduce` (default FUSE_REDUCE) merges the splits inside the one launch:
    the last program of each (sequence, kv head) reduces, `reduce_tile` splits per round of loads (a power
    of two), counted in `counters` (int32, zeroed, >= num_seqs * num_kv_heads slots, on q's device; default
    the device's shared buffer, kernels/split_k_finish.py: launches sharing one must not run
    concurrently). False: a second kernel merges them (the two-kernel path, also taken past the default
    buffer's size). `interleave`: split s reads tiles s, s + num_splits, ... of BLOCK_N tokens rather than
    one contiguous run (its first block-table load then does not wait for the context length).
    `min_split_tokens` (>= 1): only ceil(context_lens[s] / min_split_tokens) of the num_splits programs
    (at least 1) read KV, so a graph captured at the full model length splits a short context less (and
    the fused merge reads fewer partials); 1 leaves every split that has a tile working. `merge_2d`: the
    fused merge one query head at a time in 2-D tiles (kernels/split_k_finish.py). `pdl`: both kernels as
    programmatic dependent launches (Hopper; needs Triton's launch_pdl), each waiting in-kernel for the
    kernel before it, so their launches overlap the previous kernel's end. `fp8_f16` (default FP8_DOT_F16):
    over an FP8 cache with a bf16 q, q and the K/V tiles in fp16 for the dots (the output stays q's dtype; a q
    entry beyond fp16's 65504 becomes inf and its rows NaN, unchecked).
    Raises ValueError on bad shapes, dtypes or layouts.
    """
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    check_tensor("v_cache", v_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("context_lens", context_lens, 1, (torch.int32,))
    check_scale("k_scale", k_scale)
    check_scale("v_scale", v_scale)
    check_same_device(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens
    )
    num_seqs, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = check_paged_attention_args(q, k_cache, v_cache, block_tables, num_seqs)
    check_shape("context_lens", context_lens, (num_seqs,))
    if out is None:
        out = torch.empty_like(q)
    check_tensor("out", out, 3, (q.dtype,))
    check_shape("out", out, tuple(q.shape))
    if num_seqs == 0:
        return out
    if max_context_len is None:
        max_context_len = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, device_num_sms(q.device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    group = num_q_heads // num_kv_heads
    if block_n is None:
        block_n = 64 if head_dim <= 128 else 32
    direct = num_splits == 1
    fused = not direct and _use_fused_reduce(fuse_reduce, counters, num_seqs * num_kv_heads, q.device)
    if fused and counters is None:
        counters = split_counters(q.device)
    if direct:
        part_out = part_lse = out  # unused by the kernel
    else:
        part_out = torch.empty(
            num_seqs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(num_seqs, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    if min_split_tokens < 1:
        raise ValueError(f"min_split_tokens must be >= 1, got {min_split_tokens}")
    if not is_power_of_two(reduce_tile):
        raise ValueError(f"reduce_tile must be a power of two, got {reduce_tile}")
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        counters if fused else context_lens,  # the latter unused
        float(scale) * k_scale, float(v_scale), num_splits, block_tables.shape[1] * block_size, min_split_tokens,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        QUERIES_PER_KV=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, DIRECT_OUT=direct,
        FUSED_REDUCE=fused, Q_PAD=max(2, triton.next_power_of_2(group)), REDUCE_TILE=reduce_tile,
        INTERLEAVE=interleave, MERGE_2D=merge_2d, PDL=pdl, **({"launch_pdl": True} if pdl else {}),
        DOT_F16=bool(FP8_DOT_F16 if fp8_f16 is None else fp8_f16) and k_cache.dtype == torch.float8_e4m3fn
        and q.dtype == torch.bfloat16,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if not direct and not fused:
        reduce_splits(part_out, part_lse, out, num_splits, pdl=pdl)
    return out


def _use_fused_reduce(fuse_reduce: bool | None, counters: torch.Tensor | None, slots: int,
                      device: torch.device) -> bool:
    """Whether the split kernel merges its own splits; checks a caller's counter buffer."""
    if fuse_reduce is None:
        fuse_reduce = FUSE_REDUCE
    if not fuse_reduce:
        return False
    if counters is None:
        return slots <= COUNTER_SLOTS
    check_tensor("counters", counters, 1, (torch.int32,), contiguous=True)
    if counters.device != device or counters.numel() < slots:
        raise ValueError(f"counters must hold >= {slots} int32 slots on {device}, got {counters.numel()} on "
                         f"{counters.device}")
    return True
