"""Prefill attention that reads the new tokens' K/V from the step's own k / v (one row per token, through TMA
tensor descriptors) and only the cached prefix from the paged cache.

The split FlashInfer calls ragged + paged (SGLang's extend path): this step's chunk has just been computed,
so its K/V need not come back through the block table. Its tiles are dense rows of the step's k / v, which
Hopper's TMA copies into shared memory without a per-row address in registers (the paged kernel's gather
keeps a [BLOCK_N, HEAD_DIM] pointer tensor live: ~200 registers a thread at 64 x 64, which is what held
128-row query tiles back in the 9a99c62 sweep). The cached prefix is read exactly as in
`paged_prefill_attention` (`_attend_kv_range`, block ids prefetched). Over an FP8 cache the prefix is read
with `k_scale` / `v_scale` and the chunk from the unquantised k / v (FlashInfer's and SGLang's order; vLLM's
FlashAttention path reads the chunk back from the FP8 cache): a chunk's tokens attend to each other at bf16
precision, and later steps read them from the cache.

Sequence b brings q_len_b new tokens (rows cu_seqlens_q[b] ..< cu_seqlens_q[b+1] of q, k and v); its KV length
after this step is context_lens[b] = prefix_b + q_len_b. Grid: (query tiles, sequences, query heads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (Triton >= 3.3); without them ragged_layout_ok is False and the engine stays paged
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

from kernels._checks import check_same_device, check_shape, check_tensor
from kernels._jit import serving_jit
from kernels.fp8 import read_cache
from kernels.paged_decode_attention import gather_paged_kv
from kernels.paged_prefill_attention import _attend_kv_range, check_prefill_args

# Swept by scripts/bench_prefill_attention.py (block_m, block_n, num_warps, num_stages): FlashAttention-2/3-style
# Hopper tiles first.
TILE_CONFIGS = (
    (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 4, 3),
    (64, 128, 4, 3), (64, 64, 4, 3), (128, 128, 4, 3),
)
# Also swept with warp_specialize=True (Triton's automatic warp specialisation of the chunk loop; not yet timed):
# the H100's fastest tiles at dc8ddbd and two neighbours.
WARP_SPECIALIZED_TILES = ((128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 3))
# Also swept (block_m, block_n, num_warps, num_stages, maxnreg): more programs an SM. At c6876ad (H100) 64 x 64 with
# 4 warps led at 4 x 2,048 (355-369 us) and every 8-warp 128-row tile trailed (428-451 us; 4-warp ones 1,027-1,245)
# though it reads half the K/V per FLOP: an SM holds one 8-warp 128-row program (registers, and shared memory at
# 3 stages), so nothing hides its softmax behind another program's MMAs. Fewer stages and a register cap (ptxas)
# let two or more programs share it.
OCCUPANCY_TILES = ((64, 64, 4, 2, None), (64, 64, 4, 4, None), (64, 64, 4, 3, 128), (64, 64, 4, 2, 128),
                   (128, 64, 8, 2, None), (128, 64, 8, 2, 128), (128, 128, 8, 2, 128), (64, 32, 4, 3, None))
# The launcher's defaults per cache dtype, from the first sweep, on an H100 (sm_90, as the H200) at dc8ddbd
# (benchmarks/results/prefill_attention_h100_dc8ddbd.json; us at 4 x 2,048 new tokens / the RAG chunk of 450 after
# 5,200 cached; SDPA 270 / 174, the paged kernel's defaults 445 / 125 bf16 and 578 / 164 FP8, same run):
# bf16 cache: 64 x 64 tiles, 4 warps, 3 stages, reversed: 353 / 124 (128 x 128 x 8 warps: 400 / 120);
# FP8 cache: 128 x 128, 8 warps, 3 stages, reversed: 458 / 153 (64 x 64: 472 / 184). Not yet swept on the H200.
DEFAULTS = dict(block_m=64, block_n=64, num_warps=4, num_stages=3, reverse_tiles=True, fp8_f16=True,
                warp_specialize=False, maxnreg=None)
FP8_DEFAULTS = dict(DEFAULTS, block_m=128, block_n=128, num_warps=8)
# bf16 cache, chunks of at most SHORT_CHUNK_MAX_Q tokens (a serving step's chunk behind a long cached prefix, where
# the prefix loop is most of the work and 128-row tiles read half the K/V per FLOP): 128 x 128 tiles, 8 warps, in
# launch order. The RAG chunk on the H100: 120 us against the 64 x 64 default's 124 at dc8ddbd, 122 against 131 at
# c6876ad (prefill_attention_h100_c6876ad.json; the paged kernel 125 / 124 us), where the 64 x 64 default had made
# the ragged path slower than the paged one it replaced. At 4 x 2,048 the same tiles take 428-440 us against 359.
SHORT_CHUNK_MAX_Q = 512
SHORT_CHUNK_DEFAULTS = dict(DEFAULTS, block_m=128, block_n=128, num_warps=8, reverse_tiles=False)


def launch_defaults(cache_dtype: torch.dtype, max_seqlen_q: int) -> dict:
    """The options a call that names none runs with: FP8_DEFAULTS over an FP8 cache; over a bf16 / fp16 cache
    SHORT_CHUNK_DEFAULTS when no chunk exceeds SHORT_CHUNK_MAX_Q tokens; else DEFAULTS (an fp32 cache always:
    3 stages of 128 x 128 fp32 K and V tiles, 384 KiB, would not fit an SM's shared memory)."""
    if cache_dtype == torch.float8_e4m3fn:
        return FP8_DEFAULTS
    short = cache_dtype in (torch.bfloat16, torch.float16) and max_seqlen_q <= SHORT_CHUNK_MAX_Q
    return SHORT_CHUNK_DEFAULTS if short else DEFAULTS


def ragged_prefill_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]: this step's new tokens
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim], q.dtype
    """Pure-torch reference: each sequence's cached prefix gathered from the cache (dequantised), its chunk's
    K/V taken from k / v, causal softmax attention in fp32."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for b in range(context_lens.shape[0]):
        q0, q1, n = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(context_lens[b])
        prefix = n - (q1 - q0)
        kb = torch.cat([read_cache(gather_paged_kv(k_cache, block_tables[b], prefix), k_scale), k[q0:q1].float()])
        vb = torch.cat([read_cache(gather_paged_kv(v_cache, block_tables[b], prefix), v_scale), v[q0:q1].float()])
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[q0:q1].float(), kb) * scale  # [heads, q_len, n]
        causal = torch.arange(n, device=q.device)[None, :] <= torch.arange(prefix, n, device=q.device)[:, None]
        scores = scores.masked_fill(~causal, float("-inf"))
        out[q0:q1] = torch.einsum("htn,nhd->thd", scores.softmax(dim=-1), vb).to(q.dtype)
    return out


@triton.jit
def _new_kv_tile(q, m_i, l_i, acc, k_desc, v_desc, row, kv_col, q_rel, n0, chunk_len, qk_scale,
                 BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr):
    """One KV tile of `_attend_new_kv`: positions n0 ..< n0 + BLOCK_N, rows `row` ... of k / v."""
    k = k_desc.load([row, kv_col])
    s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N], unscaled
    if CAUSAL_MASK:
        s = tl.where((n0 + tl.arange(0, BLOCK_N))[None, :] <= q_rel[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = v_desc.load([row, kv_col])
    if CAUSAL_MASK:  # rows past the chunk (another sequence's, or a CUDA graph's padding: anything, NaN too) -> 0
        v = tl.where((n0 + tl.arange(0, BLOCK_N) < chunk_len)[:, None], v, 0.0)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _attend_new_kv(
    q, m_i, l_i, acc, k_desc, v_desc, row0, kv_col, q_rel, start, end, chunk_len, qk_scale,
    BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """Online-softmax update of rows `q` [BLOCK_M, HEAD_DIM] (row i at chunk position q_rel[i]) over the chunk's
    positions [start, end), read as rows row0 + position of k / v through TMA. Without CAUSAL_MASK every position
    of the range is before every row's. With it, positions after a row's are masked and V rows at or past
    `chunk_len` are zeroed: tile rows past the chunk hold the next sequence's tokens, TMA's zero fill past the
    tensor, or a CUDA graph's padding rows, whose k / v may be NaN (a masked p of 0 times NaN is NaN); a masked
    score becomes -inf whatever K held. WARP_SPECIALIZE: Triton's automatic warp
    specialisation of the loop (TMA producer warps, MMA / softmax consumers); the branch not taken is not compiled,
    so a Triton without the option fails only the configs that ask for it."""
    if WARP_SPECIALIZE:
        for n0 in tl.range(start, end, BLOCK_N, warp_specialize=True):
            m_i, l_i, acc = _new_kv_tile(q, m_i, l_i, acc, k_desc, v_desc, row0 + n0, kv_col, q_rel, n0, chunk_len,
                                         qk_scale, BLOCK_N, CAUSAL_MASK)
    else:
        for n0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = _new_kv_tile(q, m_i, l_i, acc, k_desc, v_desc, row0 + n0, kv_col, q_rel, n0, chunk_len,
                                         qk_scale, BLOCK_N, CAUSAL_MASK)
    return m_i, l_i, acc


@serving_jit(ints=("stride_bts",), pointers=("q_ptr", "block_tables_ptr", "cu_seqlens_q_ptr", "context_lens_ptr",
                                            "out_ptr"))
def _ragged_prefill_kernel(
    q_ptr, k_desc, v_desc, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_q_ptr, context_lens_ptr, out_ptr,
    scale, k_scale, v_scale, stride_qt, stride_qh, stride_cb, stride_ct, stride_ch, stride_bts, stride_ot, stride_oh,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, REVERSE_TILES: tl.constexpr, DOT_F16: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
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
    prefix = tl.load(context_lens_ptr + seq) - q_len
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_valid = offs_m < q_len
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :], mask=m_valid[:, None],
                other=0.0)
    log2e = 1.4426950408889634  # softmax in base 2; m_i in scaled units
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    kv_head = head // QUERIES_PER_KV
    if prefix > 0:  # the cached prefix: every position is before every row's, only its last tile is ragged
        q_c = q.to(tl.float16) if DOT_F16 else q  # FP8 cache: e4m3 -> fp16 is exact and cheaper than -> bf16
        bt_row = block_tables_ptr + seq * stride_bts
        full_end = prefix // BLOCK_N * BLOCK_N
        m_i, l_i, acc = _attend_kv_range(
            q_c, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, kv_head * stride_ch, prefix + offs_m, 0, full_end,
            scale * k_scale * log2e, stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, True, False,
        )  # fmt: skip
        m_i, l_i, acc = _attend_kv_range(
            q_c, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, kv_head * stride_ch, prefix + offs_m, full_end,
            prefix, scale * k_scale * log2e, stride_cb, stride_ct, HEAD_DIM, BLOCK_SIZE, BLOCK_N, True, True, False,
        )  # fmt: skip
        acc = acc * v_scale  # the cached V's scale, once: the online rescales are multiplicative
    # the chunk: positions before the tile's first row need no mask; the rest, up to its last row, do
    chunk_end = tl.minimum(q_len, (tile + 1) * BLOCK_M)
    full_end = tile * BLOCK_M // BLOCK_N * BLOCK_N
    q_rel = offs_m
    m_i, l_i, acc = _attend_new_kv(q, m_i, l_i, acc, k_desc, v_desc, q_start, kv_head * HEAD_DIM, q_rel, 0,
                                   full_end, q_len, scale * log2e, BLOCK_N, False, WARP_SPECIALIZE)
    m_i, l_i, acc = _attend_new_kv(q, m_i, l_i, acc, k_desc, v_desc, q_start, kv_head * HEAD_DIM, q_rel, full_end,
                                   chunk_end, q_len, scale * log2e, BLOCK_N, True, WARP_SPECIALIZE)
    out = acc / l_i[:, None]
    o_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_valid[:, None])


def ragged_layout_ok(x: torch.Tensor) -> bool:
    """Whether [num_tokens, num_kv_heads, head_dim] `x` can be read through a TMA descriptor: heads contiguous
    within a row, 16-byte aligned rows and start, head_dim <= 256 (a TMA box dimension)."""
    return (TensorDescriptor is not None and x.stride(2) == 1 and x.stride(1) == x.shape[2] and x.shape[2] <= 256
            and (x.stride(0) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0)


def _rows_descriptor(x: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """[num_tokens, num_kv_heads, head_dim] (heads contiguous within a row) as a 2-D TMA descriptor over
    [num_tokens, num_kv_heads * head_dim], tiles of [block_rows, head_dim]."""
    t, h, d = x.shape
    return TensorDescriptor(x, [t, h * d], [x.stride(0), 1], [block_rows, d])


def ragged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]: the chunk's keys (also written to k_cache)
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
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
    fp8_f16: bool | None = None,
    warp_specialize: bool | None = None,
    maxnreg: int | None = None,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim], q.dtype
    """Causal varlen attention of new query tokens over their cached prefix (paged, FP8 with `k_scale` /
    `v_scale` or q's dtype) and their own chunk (`k` / `v`, q's dtype); see the module docstring.

    `max_seqlen_q` (python int, tokens) bounds every q_len_b and sizes the grid: no host sync. Requires
    context_lens[b] >= q_len_b; head_dim a power of two >= 16; `k` / `v` rows 16-byte aligned with their heads
    contiguous (TMA). `block_m` / `block_n` (powers of two >= 16) count a program's query rows and a KV tile's
    positions; `reverse_tiles` launches the longest query tiles first; `fp8_f16`: over an FP8 cache and a bf16 q
    the prefix's dots run in fp16; `warp_specialize`: the chunk loop through Triton's warp specialisation; `maxnreg`
    caps registers per thread (ptxas; None: no cap). Options left as None take `launch_defaults` (by the cache
    dtype and max_seqlen_q). Raises ValueError on bad shapes, dtypes, layouts, block_m or block_n."""
    opts = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                reverse_tiles=reverse_tiles, fp8_f16=fp8_f16, warp_specialize=warp_specialize, maxnreg=maxnreg)
    defaults = launch_defaults(k_cache.dtype, max_seqlen_q)
    opts = {key: defaults[key] if val is None else val for key, val in opts.items()}  # maxnreg None: no cap
    out, block_size, num_kv_heads = check_prefill_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens,
                                                       k_scale, v_scale, out, block_m=opts["block_m"],
                                                       block_n=opts["block_n"])
    if opts["block_n"] > 256:
        raise ValueError(f"block_n must be <= 256 (a TMA box dimension), got {opts['block_n']}")
    for name, x in (("k", k), ("v", v)):
        check_tensor(name, x, 3, (q.dtype,))
        check_shape(name, x, (q.shape[0], k_cache.shape[2], q.shape[2]))
        if TensorDescriptor is None:
            raise ValueError("this Triton has no host-side TMA descriptors (triton.tools.tensor_descriptor)")
        if not ragged_layout_ok(x):
            raise ValueError(f"{name} needs contiguous heads, 16-byte aligned rows and start and head_dim <= 256, "
                             f"got shape {tuple(x.shape)}, strides {x.stride()}, address {x.data_ptr()}")
    check_same_device(q=q, k=k, v=v)
    num_tokens, num_q_heads, head_dim = q.shape
    num_seqs = context_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0 or max_seqlen_q <= 0:
        return out
    bm, bn = opts["block_m"], opts["block_n"]
    _ragged_prefill_kernel[(triton.cdiv(max_seqlen_q, bm), num_seqs, num_q_heads)](
        q, _rows_descriptor(k, bn), _rows_descriptor(v, bn), k_cache, v_cache, block_tables, cu_seqlens_q,
        context_lens, out, float(scale), float(k_scale), float(v_scale), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        QUERIES_PER_KV=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=bm,
        BLOCK_N=bn, REVERSE_TILES=bool(opts["reverse_tiles"]),
        DOT_F16=bool(opts["fp8_f16"]) and k_cache.dtype == torch.float8_e4m3fn and q.dtype == torch.bfloat16,
        WARP_SPECIALIZE=bool(opts["warp_specialize"]), num_warps=opts["num_warps"], num_stages=opts["num_stages"],
        **({"maxnreg": int(opts["maxnreg"])} if opts["maxnreg"] else {}),
    )  # fmt: skip
    return out
