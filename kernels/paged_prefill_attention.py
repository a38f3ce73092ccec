"""Varlen (chunked) prefill attention that reads K/V from the paged cache only.

Sequence b brings q_len_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] new query tokens; its KV length after
this step is context_lens[b] (cached prefix + the new chunk, already written to the cache). Query token i
sits at position context_lens[b] - q_len_b + i and attends causally to KV positions <= its own.

A program handles BLOCK_M query tokens of one sequence and one query head (grid: M tiles, seqs, query
heads); with GQA each K/V tile is loaded by every query head of its group. Packing a group's query heads
into one program's rows (one K/V load per group) was measured on the H200 at most 3% faster, on 4 x 2,048
tokens and on the RAG case's 450-token chunk (benchmarks/results/kernels_h200_add5b01.json; the code is in
commit add5b01), and was removed. An FP8 (e4m3) cache is read with per-tensor `k_scale` / `v_scale`
(kernels/fp8.py); with a bf16 q its dots run in fp16 (`fp8_f16`: e4m3 -> fp16 is one conversion per 2 values,
-> bf16 three; the tiles stay exact).

Compiled for sm_90 offline (Triton 3.9, ptxas 12.9; not the device's 3.6), the 64 x 64 bf16 tile uses ~200
registers a thread: 2 programs of 4 warps an SM. `maxnreg=168` fits 3 without spills where shared memory
allows; `lazy_rescale` (FlashAttention-4's conditional rescale) raised registers to 255 there. Timed on the
H200 at 9a99c62 (benchmarks/results/prefill_attention_h200_9a99c62.json, see DEFAULTS): lazy_rescale was slower
or level everywhere, maxnreg=168 with 1 stage gave the fastest FP8 config on 4 x 2,048 only, fp8_f16 took 16-26%
less time than bf16 dots over an FP8 cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_paged_attention_args, check_same_device, check_shape, check_tensor
from kernels._jit import serving_jit
from kernels.fp8 import KV_CACHE_DTYPES, check_scale, read_cache
from kernels.paged_decode_attention import gather_paged_kv

# Tile configs (block_m, block_n, num_warps, num_stages) the H200 bench sweeps (scripts/bench_prefill_attention.py
# --sweep): the aab412d default first, then FlashAttention-2-style Hopper candidates (128-row query tiles over 8 warps,
# 32/64/128-wide KV tiles, 2-4 pipeline stages). Each (block_m, block_n) is checked against the reference in
# Triton's interpreter (tests/kernels/test_paged_prefill_attention.py); warps and stages only schedule.
TILE_CONFIGS = (
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 3), (64, 32, 4, 3),
    (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 4),
    (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 8, 3), (128, 32, 4, 4),
)


# The launcher's defaults, per cache dtype: one line each to change after an H200 sweep. Figures: the H200 sweep at
# 9a99c62 (benchmarks/results/prefill_attention_h200_9a99c62.json, `scripts/bench_prefill_attention.py --sweep
# --commit 9a99c62`; us, 4 x 2,048 new tokens / the RAG chunk of 450 after 5,200 cached; SDPA 280 / 175 us).
# bf16: 64 x 64 tiles over 4 warps, 3 stages, prefetch: the fastest config at both shapes there (441 / 123 us =
# 63.4% / 142.6% of SDPA; no swept config within 3%: the closest, this config timed again, 444 / 124 us, and with
# reverse tiles 123 us on the RAG chunk), as at aab412d (prefill_attention_h200_aab412d.json).
# FP8: no config was within 2% of the fastest at both shapes (4 x 2,048: 527 us, 64 x 64, 1 stage, maxnreg 168,
# which took 206 us on the RAG chunk; RAG chunk: 166 us, the config below). The one with the best geometric mean of
# the two time ratios to each shape's fastest (1.045): 64 x 128 tiles, 4 warps, 3 stages, no prefetch, query tiles
# in reverse order, fp8_f16: 575 / 166 us = 48.6% / 105.5% of SDPA, against 562 / 190 us (49.8% / 92.1%) for the
# 9a99c62 FP8 default (64 x 64, 2 stages, prefetch; geometric mean 1.105): 2.4% slower on 4 x 2,048, 1.15x as fast
# on the RAG chunk. (Prefetch at 64 x 128 took 892 / 256 us.) Not yet timed as the launcher's default.
# Options timed in that sweep: fp8_f16 (over an FP8 cache, 64 x 64 x 2 stages + prefetch: 561 / 190 us with fp16
# dots, 670 / 258 us with bf16 dots); lazy_rescale (bf16 444 -> 515 / 124 -> 147 us, FP8 561 -> 646 / 190 -> 199 us
# at 2 stages, level at best: never faster); maxnreg 168 (FP8 1 stage: 527 / 206 us, the 4 x 2,048 fastest; bf16 1
# stage 472 / 199 us; at 2 stages + prefetch slower than uncapped or level: bf16 510 / 156 vs 478 / 150, FP8 564 /
# 190 vs 561 / 190).
DEFAULTS = dict(block_m=64, block_n=64, num_warps=4, num_stages=3, prefetch=True, lazy_rescale=False, fp8_f16=True,
                maxnreg=None, reverse_tiles=False)  # (fp8_f16 acts on FP8 caches only)
FP8_DEFAULTS = dict(DEFAULTS, block_n=128, num_stages=3, prefetch=False, reverse_tiles=True)
# The launcher defaults at aab412d (before prefetch, lazy_rescale, fp8_f16, maxnreg): the bench's "baseline".
BASELINE = dict(block_m=64, block_n=64, num_warps=4, num_stages=2, prefetch=False, lazy_rescale=False, fp8_f16=False,
                maxnreg=None, reverse_tiles=False)
RESCALE_THRESHOLD = tl.constexpr(8.0)  # lazy_rescale: a row's max may lag by 8 (log2 units): p <= 256


def paged_prefill_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim], q.dtype
    """Pure-torch reference: gather each sequence's K/V (an FP8 cache dequantised with k_scale / v_scale),
    causal softmax attention in fp32."""
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    for b in range(context_lens.shape[0]):
        q0, q1, n = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(context_lens[b])
        k = read_cache(gather_paged_kv(k_cache, block_tables[b], n), k_scale).repeat_interleave(group, dim=1)
        v = read_cache(gather_paged_kv(v_cache, block_tables[b], n), v_scale).repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[q0:q1].float(), k) * scale  # [heads, q_len, n]
        q_pos = torch.arange(n - (q1 - q0), n, device=q.device)
        causal = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]  # [q_len, n]
        scores = scores.masked_fill(~causal, float("-inf"))
        out[q0:q1] = torch.einsum("htn,nhd->thd", scores.softmax(dim=-1), v).to(q.dtype)
    return out


@triton.jit
def _attend_kv_range(
    q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, head_off, q_pos, kv_start, kv_end, qk_scale,
    stride_cb, stride_ct, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL_MASK: tl.constexpr, PREFETCH: tl.constexpr, LAZY_RESCALE: tl.constexpr,
):  # fmt: skip
    """Online-softmax update of rows `q` [ROWS, HEAD_DIM], row i at token position q_pos[i] (rows may mix
    tokens and heads), over KV positions [kv_start, kv_end); masks (causal, bounds) only where CAUSAL_MASK.
    Without CAUSAL_MASK the range must lie inside the context and at or before every row's position (the
    caller's full tiles): its loads are then unmasked. `qk_scale` is applied inside the exponent (one FMA per
    score, as FlashAttention does), `m_i` is kept in scaled units. PREFETCH: the next tile's block ids are
    loaded while this tile computes and V is loaded with K, so a tile's K/V loads wait for no other load (the
    block-table load -> K/V load chain is otherwise on every iteration's critical path).
    LAZY_RESCALE (full tiles only; FlashAttention-4's conditional rescaling): `m_i` moves, and `acc` / `l_i`
    are rescaled, only on tiles where some row's max grows by more than RESCALE_THRESHOLD (log2 units);
    otherwise the stale max is kept, so p <= 2**RESCALE_THRESHOLD and the tile skips the [ROWS, HEAD_DIM]
    multiply of `acc` and the exp2 of alpha. Exact up to rounding: `acc` and `l_i` always share `m_i`."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    if PREFETCH:
        first = kv_start + offs_n
        next_block = tl.load(bt_row + first // BLOCK_SIZE, mask=first < kv_end, other=0).to(tl.int64)
    for n0 in range(kv_start, kv_end, BLOCK_N):
        pos = n0 + offs_n
        if CAUSAL_MASK:
            valid = pos < kv_end
        if PREFETCH:
            block = next_block
            ahead = pos + BLOCK_N
            next_block = tl.load(bt_row + ahead // BLOCK_SIZE, mask=ahead < kv_end, other=0).to(tl.int64)
        elif CAUSAL_MASK:
            block = tl.load(bt_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        else:
            block = tl.load(bt_row + pos // BLOCK_SIZE).to(tl.int64)
        kv_off = (block * stride_cb + (pos % BLOCK_SIZE) * stride_ct + head_off)[:, None] + offs_d[None, :]
        if CAUSAL_MASK:
            k = tl.load(k_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(q.dtype)  # FP8: exact cast
        else:
            k = tl.load(k_cache_ptr + kv_off).to(q.dtype)
        if PREFETCH:
            if CAUSAL_MASK:
                v = tl.load(v_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(q.dtype)
            else:
                v = tl.load(v_cache_ptr + kv_off).to(q.dtype)
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N], unscaled
        if CAUSAL_MASK:
            s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        if LAZY_RESCALE and not CAUSAL_MASK:  # full tiles: every row's s is finite, so m_new is
            if tl.max(m_new - m_i, 0) > RESCALE_THRESHOLD:  # the first tile always rescales (m_i = -inf)
                alpha = tl.exp2(m_i - m_new)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            p = tl.exp2(s * qk_scale - m_i[:, None])
            l_i = l_i + tl.sum(p, 1)
            if not PREFETCH:
                v = tl.load(v_cache_ptr + kv_off).to(q.dtype)
            acc = tl.dot(p.to(v.dtype), v, acc)
        else:
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s * qk_scale - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if not PREFETCH:
                if CAUSAL_MASK:
                    v = tl.load(v_cache_ptr + kv_off, mask=valid[:, None], other=0.0).to(q.dtype)
                else:
                    v = tl.load(v_cache_ptr + kv_off).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
    return m_i, l_i, acc


@serving_jit(ints=("stride_bts",), pointers=("q_ptr", "block_tables_ptr", "cu_seqlens_q_ptr", "context_lens_ptr",
                                            "out_ptr"))
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_q_ptr, context_lens_ptr, out_ptr,
    scale, v_scale, stride_qt, stride_qh, stride_cb, stride_ct, stride_ch, stride_bts, stride_ot, stride_oh,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, REVERSE_TILES: tl.constexpr, PREFETCH: tl.constexpr,
    LAZY_RESCALE: tl.constexpr, DOT_F16: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    if REVERSE_TILES:  # a sequence's last (longest) query tiles start first: a shorter tail of the grid
        tile = tl.num_programs(0) - 1 - tile
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    prefix = ctx - q_len
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_valid = offs_m < q_len
    q_pos = prefix + offs_m  # [BLOCK_M], >= 0, so KV position 0 keeps every row's max finite
    q_rows = (q_start + offs_m).to(tl.int64)
    q_ptrs = q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_valid[:, None], other=0.0)
    if DOT_F16:  # FP8 cache: e4m3 -> fp16 is one cvt per 2 values (-> bf16 goes through fp16: 3), exact
        q = q.to(tl.float16)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bts
    head_off = (head // QUERIES_PER_KV) * stride_ch
    # KV blocks wholly at or before this tile's first query need no mask; the rest, up to its last query, do
    kv_end = tl.minimum(ctx, prefix + (tile + 1) * BLOCK_M)
    full_end = tl.minimum((prefix + tile * BLOCK_M + 1) // BLOCK_N * BLOCK_N, kv_end)
    m_i, l_i, acc = _attend_kv_range(
        q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, head_off, q_pos, 0, full_end, qk_scale,
        stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, PREFETCH, LAZY_RESCALE,
    )  # fmt: skip
    m_i, l_i, acc = _attend_kv_range(
        q, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, head_off, q_pos, full_end, kv_end, qk_scale,
        stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N, True, PREFETCH, LAZY_RESCALE,
    )  # fmt: skip
    out = acc / l_i[:, None] * v_scale
    o_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_valid[:, None])


def check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, k_scale: float, v_scale: float,
                       out: torch.Tensor | None, **tile_sizes: int) -> tuple[torch.Tensor, int, int]:
    """The prefill launchers' argument checks (shapes, dtypes, layouts, devices, scales; every `tile_sizes` value
    a power of two >= 16). Returns (out, allocated when None; block_size; num_kv_heads). Raises ValueError."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    check_tensor("v_cache", v_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    check_scale("k_scale", k_scale)
    check_scale("v_scale", v_scale)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,))
    check_tensor("context_lens", context_lens, 1, (torch.int32,))
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, cu_seqlens_q=cu_seqlens_q)
    num_seqs = context_lens.shape[0]
    block_size, num_kv_heads = check_paged_attention_args(q, k_cache, v_cache, block_tables, num_seqs)
    check_shape("cu_seqlens_q", cu_seqlens_q, (num_seqs + 1,))
    if out is None:
        out = torch.empty_like(q)
    check_tensor("out", out, 3, (q.dtype,))
    check_shape("out", out, tuple(q.shape))
    for name, size in tile_sizes.items():
        if size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {size}")
    return out, block_size, num_kv_heads


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    max_seqlen_q: int,
    out: torch.Tensor | None = None,  # [num_tokens, num_q_heads, head_dim]
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    reverse_tiles: bool | None = None,
    prefetch: bool | None = None,
    lazy_rescale: bool | None = None,
    fp8_f16: bool | None = None,
    maxnreg: int | None = None,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim], q.dtype
    """Causal varlen attention of new query tokens over the paged cache (see the module docstring).

    `max_seqlen_q` (a python int, tokens) bounds every q_len_b and sizes the grid, so no host sync is
    needed. Requires context_lens[b] >= q_len_b. head_dim: power of two >= 16. `scale` multiplies q.k.
    `block_m` (power of two >= 16) counts a program's query tokens; `reverse_tiles` launches the query tiles
    last first (under a causal mask the last tiles have the most keys); `prefetch` loads the next KV tile's
    block ids ahead and V with K; `lazy_rescale` rescales the output accumulator only when a row's running
    max grows by more than RESCALE_THRESHOLD (see `_attend_kv_range`). The caches hold q's dtype or are
    float8_e4m3fn (an FP8 KV cache, values times `k_scale` / `v_scale`); over an FP8 cache and a bf16 q, `fp8_f16`
    runs both dots in fp16 (q cast to fp16: needs |q| < 65504; K/V tiles cast exactly; P in fp16), not bf16.
    `maxnreg` caps registers per thread (ptxas): at 168, 3 programs of 4 warps fit an SM's 64 K registers where
    shared memory allows (64 x 64 tiles: 1 stage of bf16, 2 of FP8), at ~200 (uncapped) 2. Options left as
    None take DEFAULTS (FP8_DEFAULTS over an FP8 cache). Launches without host syncs.
    Raises ValueError on bad shapes, dtypes, layouts or block_m.
    """
    opts = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages, prefetch=prefetch,
                lazy_rescale=lazy_rescale, fp8_f16=fp8_f16, maxnreg=maxnreg, reverse_tiles=reverse_tiles)
    defaults = FP8_DEFAULTS if k_cache.dtype == torch.float8_e4m3fn else DEFAULTS
    opts = {k: defaults[k] if v is None else v for k, v in opts.items()}
    block_m, block_n, num_warps, num_stages = opts["block_m"], opts["block_n"], opts["num_warps"], opts["num_stages"]
    out, block_size, num_kv_heads = check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens,
                                                       k_scale, v_scale, out, block_m=block_m)
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_seqlen_q <= 0:
        return out
    group = num_q_heads // num_kv_heads
    _prefill_kernel[(triton.cdiv(max_seqlen_q, block_m), num_seqs, num_q_heads)](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out,
        float(scale) * k_scale, float(v_scale), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        QUERIES_PER_KV=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, REVERSE_TILES=bool(opts["reverse_tiles"]), PREFETCH=bool(opts["prefetch"]),
        LAZY_RESCALE=bool(opts["lazy_rescale"]),
        DOT_F16=bool(opts["fp8_f16"]) and k_cache.dtype == torch.float8_e4m3fn and q.dtype == torch.bfloat16,
        num_warps=num_warps,
        num_stages=num_stages,
        **({"maxnreg": int(opts["maxnreg"])} if opts["maxnreg"] else {}),
    )  # fmt: skip
    return out
