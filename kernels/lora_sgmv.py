"""Segmented LoRA for mixed-adapter batches: the step's tokens grouped by adapter slot, each slot's A and B
read once per tile of up to TILE_M of its tokens (Punica's SGMV, Chen et al. 2023,
https://arxiv.org/abs/2310.18547; S-LoRA's mixed ranks, Sheng et al. 2023, https://arxiv.org/abs/2311.03285).

BGMV (kernels/lora_bgmv.py) reads the adapter's weights once per token: at batch 240 on 30 adapters that is
240 reads of each A and B per projection and layer where 30 would do, and a prefill chunk of 2,048 tokens on
one adapter reads it 2,048 times. Here the host sorts the step's tokens by slot and cuts each slot's run
(a segment) into tiles of at most TILE_M tokens (`build_tiles`); a program owns one tile and multiplies
the tile's gathered rows by the slot's weights with `tl.dot`:

    shrink:  s[i, t, :]  = A[i, slot(t)] @ x[t]          A [slices, slots, R, in],  s [slices, T, R] fp32
    expand:  y[t, off_i:off_i+1] += B[slot(t), :, off_i:off_i+1]^T s[i, t]     B [slots, R, sum(out)]

for every slice i of a fused projection (q, k, v of qkv_proj; gate, up), one launch each for all slices.
Mixed ranks: `ranks[i, slot]` rows are used (0: the slot's adapter does not target slice i, skipped);
larger ranks are covered by rank blocks. Base-model tokens (slot -1) are in no tile: their `y` rows are
never touched and their `s` rows are left undefined.

Static shapes for CUDA graphs: the metadata are two int32 device buffers of fixed size, `tokens`
[>= T] (token indices grouped by slot) and `tiles` [3, >= max_tiles(T, slots)] (each tile's slot, start in
`tokens`, length; slot -1 for unused tiles, whose programs exit at once). Every grid depends only on T and
the weights' shapes, so a graph captured once replays any adapter mix of its token count.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_same_device, check_tensor

TILE_M = 16  # tokens per tile (tl.dot needs at least 16 rows)
# tokens per tile for large eager steps (prefill chunks: segments of hundreds of one adapter's tokens), where
# 16-token tiles re-read each adapter's A and B every 16 tokens and launch 4x the programs
PREFILL_TILE_M = 64
_BLOCK_K = 64  # in_features per shrink loop step
_BLOCK_N = 128  # output columns per expand program
_MAX_BLOCK_R = 64  # rank rows per shrink program (larger ranks: several rank blocks)
# rank rows per step of the expand's loop over the slot's own rank (loaded at run time): a rank-16 adapter
# does one 16-row step whatever `max_lora_rank` the buffers (and a CUDA graph's captured kernels) are sized
# for, where a block of 64 did four times the tensor-core work on zero rows; a rank-64 one does four steps
_EXPAND_BLOCK_R = 16
_TARGET_PROGRAMS = 512  # shrink programs to aim for (split-K when there are few tiles)
_MAX_SPLITS = 16  # split-K partials (a power of two: the expand's unrolled sum compiles for 1, 2, 4, 8, 16)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def max_tiles(num_tokens: int, num_slots: int, tile_m: int = TILE_M) -> int:
    """Upper bound on the tiles of `num_tokens` tokens spread over at most `num_slots` slots:
    sum over segments of ceil(n_s / tile_m) <= ceil(T / tile_m) + (segments - 1)."""
    if num_tokens <= 0:
        return 0
    return -(-num_tokens // tile_m) + min(num_slots, num_tokens) - 1


def build_tiles(token_slots: np.ndarray, num_tokens_cap: int, num_tiles_cap: int, tile_m: int = TILE_M
                ) -> tuple[np.ndarray, np.ndarray]:
    """Host-side segment metadata for one step.

    Args:
        token_slots: [T] int, each token's slot (-1: base model, or padding).
        num_tokens_cap, num_tiles_cap: the sizes of the fixed device buffers (>= T, >= the tile count).
    Returns:
        tokens [num_tokens_cap] int32: the adapter tokens' indices, grouped by slot (stable), then 0s;
        tiles [3, num_tiles_cap] int32: rows slot, start (into `tokens`), length; slot -1 past the last tile.
    Raises:
        ValueError: a buffer is too small.
    """
    token_slots = np.asarray(token_slots)
    if token_slots.shape[0] > num_tokens_cap:
        raise ValueError(f"{token_slots.shape[0]} tokens exceed the token buffer's {num_tokens_cap}")
    adapter = np.flatnonzero(token_slots >= 0)
    order = adapter[np.argsort(token_slots[adapter], kind="stable")]
    tokens = np.zeros(num_tokens_cap, dtype=np.int32)
    tokens[: order.size] = order
    tiles = np.zeros((3, num_tiles_cap), dtype=np.int32)
    tiles[0] = -1
    if not order.size:
        return tokens, tiles
    sorted_slots = token_slots[order]
    seg_starts = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
    seg_ends = np.r_[seg_starts[1:], order.size]
    per_seg = -(-(seg_ends - seg_starts) // tile_m)
    num_tiles = int(per_seg.sum())
    if num_tiles > num_tiles_cap:
        raise ValueError(f"{num_tiles} tiles exceed the tile buffer's {num_tiles_cap}")
    seg = np.repeat(np.arange(seg_starts.size), per_seg)
    within = np.arange(num_tiles) - np.repeat(np.cumsum(per_seg) - per_seg, per_seg)
    starts = seg_starts[seg] + within * tile_m
    tiles[0, :num_tiles] = sorted_slots[seg_starts[seg]]
    tiles[1, :num_tiles] = starts
    tiles[2, :num_tiles] = np.minimum(tile_m, seg_ends[seg] - starts)
    return tokens, tiles


# ---- pure-torch references ------------------------------------------------------------------------------
def sgmv_shrink_ref(x, a, ranks, token_slots):  # x [T, in], a [I, S, R, in], ranks [I, S] -> [I, T, R] fp32
    """fp32 products; zero for base-model tokens, past each slot's rank and for untargeted slices."""
    out = torch.zeros(a.shape[0], x.shape[0], a.shape[2], dtype=torch.float32, device=x.device)
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            for i in range(a.shape[0]):
                r = int(ranks[i, slot])
                out[i, t, :r] = a[i, slot, :r].float() @ x[t].float()
    return out


def sgmv_expand_ref(y, s, b, ranks, token_slots, slice_sizes):  # y [T, sum(out)], s [I, T, R], b [S, R, sum]
    """y[t, slice i] + B[slot, :rank, slice i]^T s[i, t, :rank] in fp32, rounded once to y.dtype."""
    out = y.float().clone()
    offsets = np.cumsum([0, *slice_sizes])
    for t, slot in enumerate(token_slots.tolist()):
        if slot >= 0:
            for i in range(len(slice_sizes)):
                r, lo, hi = int(ranks[i, slot]), offsets[i], offsets[i + 1]
                out[t, lo:hi] += s[i, t, :r] @ b[slot, :r, lo:hi].float()
    return out.to(y.dtype)


# ---- kernels --------------------------------------------------------------------------------------------
@triton.jit
def _sgmv_shrink_kernel(x_ptr, a_ptr, ranks_ptr, tokens_ptr, tiles_ptr, out_ptr, in_features, k_chunk,
                        rank_blocks, stride_tiles, stride_x, stride_ai, stride_as, stride_ar, stride_ranks,
                        stride_osplit, stride_oi, stride_ot, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                        BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr):
    # program (tile, slice * rank_blocks + rank block, split): the tile's tokens x one rank block of the
    # slot's A, over the split's chunk of in_features, into the split's own partial rows
    tile = tl.program_id(0)
    sl = tl.program_id(1) // rank_blocks
    r0 = (tl.program_id(1) % rank_blocks) * BLOCK_R
    split = tl.program_id(2)
    slot = tl.load(tiles_ptr + tile)
    rank = tl.load(ranks_ptr + sl * stride_ranks + tl.maximum(slot, 0))
    if (slot >= 0) & (rank > r0):
        start = tl.load(tiles_ptr + stride_tiles + tile)
        count = tl.load(tiles_ptr + 2 * stride_tiles + tile)
        m = tl.arange(0, BLOCK_M)
        m_mask = m < count
        tok = tl.load(tokens_ptr + start + m, mask=m_mask, other=0).to(tl.int64)
        r = r0 + tl.arange(0, BLOCK_R)
        r_mask = r < rank
        a_base = a_ptr + sl.to(tl.int64) * stride_ai + slot.to(tl.int64) * stride_as + r[None, :] * stride_ar
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        k_start = split * k_chunk
        k_end = tl.minimum(in_features, k_start + k_chunk)
        for k in range(k_start, k_end, BLOCK_K):
            k_offs = k + tl.arange(0, BLOCK_K)
            k_mask = k_offs < k_end
            xv = tl.load(x_ptr + tok[:, None] * stride_x + k_offs[None, :], mask=m_mask[:, None] & k_mask[None, :],
                         other=0.0)
            av = tl.load(a_base + k_offs[:, None], mask=k_mask[:, None] & r_mask[None, :], other=0.0).to(xv.dtype)
            if FP32_DOT:
                acc += tl.dot(xv.to(tl.float32), av.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(xv, av)
        out = out_ptr + split * stride_osplit + sl * stride_oi + tok[:, None] * stride_ot + r[None, :]
        tl.store(out, acc, mask=m_mask[:, None] & r_mask[None, :])


@triton.jit
def _sgmv_expand_kernel(y_ptr, s_ptr, b_ptr, ranks_ptr, tokens_ptr, tiles_ptr, offsets_ptr, stride_tiles,
                        stride_y, stride_ssplit, stride_si, stride_st, stride_bs, stride_br, stride_ranks,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                        NUM_SPLITS: tl.constexpr, FP32_DOT: tl.constexpr):
    # program (tile, column block of the slice, slice): y[tile's tokens, columns] += s[...] @ B[slot][:, columns],
    # s the sum of the shrink's split-K partials (summed here: no reduction kernel between the two)
    tile = tl.program_id(0)
    sl = tl.program_id(2)
    slot = tl.load(tiles_ptr + tile)
    rank = tl.load(ranks_ptr + sl * stride_ranks + tl.maximum(slot, 0))
    n_start = tl.load(offsets_ptr + sl) + tl.program_id(1) * BLOCK_N
    n_end = tl.load(offsets_ptr + sl + 1)
    if (slot >= 0) & (rank > 0) & (n_start < n_end):
        start = tl.load(tiles_ptr + stride_tiles + tile)
        count = tl.load(tiles_ptr + 2 * stride_tiles + tile)
        m = tl.arange(0, BLOCK_M)
        m_mask = m < count
        tok = tl.load(tokens_ptr + start + m, mask=m_mask, other=0).to(tl.int64)
        n = n_start + tl.arange(0, BLOCK_N)
        n_mask = n < n_end
        b_base = b_ptr + slot.to(tl.int64) * stride_bs + n[None, :]
        s_base = s_ptr + sl.to(tl.int64) * stride_si + tok[:, None] * stride_st
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, rank, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            r_mask = r < rank
            sv = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for split in tl.static_range(NUM_SPLITS):  # unrolled: the partials' loads issue together
                sv += tl.load(s_base + split * stride_ssplit + r[None, :], mask=m_mask[:, None] & r_mask[None, :],
                              other=0.0)
            bv = tl.load(b_base + r[:, None] * stride_br, mask=r_mask[:, None] & n_mask[None, :], other=0.0)
            if FP32_DOT:
                acc += tl.dot(sv, bv.to(tl.float32), input_precision="ieee")
            else:  # the fp32 shrink output rounded to B's dtype (bf16/fp16): tensor cores, fp32 accumulation
                acc += tl.dot(sv.to(bv.dtype), bv)
        y = y_ptr + tok[:, None] * stride_y + n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
        yv = tl.load(y, mask=mask, other=0.0).to(tl.float32)
        tl.store(y, (yv + acc).to(y_ptr.dtype.element_ty), mask=mask)


# ---- launchers ------------------------------------------------------------------------------------------
def _check_meta(tokens: torch.Tensor, tiles: torch.Tensor, ranks: torch.Tensor, num_tokens: int, num_slices: int,
                num_slots: int, tile_m: int) -> int:
    """Validate the metadata; returns the grid's tile count for `num_tokens` tokens in tiles of `tile_m`."""
    check_tensor("tokens", tokens, 1, (torch.int32,))
    check_tensor("tiles", tiles, 2, (torch.int32,))
    check_tensor("ranks", ranks, 2, (torch.int32,))
    if tile_m not in (TILE_M, PREFILL_TILE_M):
        raise ValueError(f"tile_m must be {TILE_M} or {PREFILL_TILE_M}, got {tile_m}")
    grid_tiles = max_tiles(num_tokens, num_slots, tile_m)
    if tokens.shape[0] < num_tokens:
        raise ValueError(f"tokens must have >= {num_tokens} entries, got {tokens.shape[0]}")
    if tiles.shape[0] != 3 or tiles.shape[1] < grid_tiles:
        raise ValueError(f"tiles must have shape [3, >= {grid_tiles}], got {tuple(tiles.shape)}")
    if tuple(ranks.shape) != (num_slices, num_slots):
        raise ValueError(f"ranks must have shape {(num_slices, num_slots)}, got {tuple(ranks.shape)}")
    return grid_tiles


def _fp32_dot(dtype: torch.dtype) -> bool:
    """fp32 products (exact `ieee` dots) for fp32 data, and always under Triton's interpreter, whose
    `tl.dot` of bf16 operands is wrong (numpy has no bf16); tensor cores for bf16/fp16 on the GPU."""
    return dtype == torch.float32 or _INTERPRET


def _num_warps(tile_m: int) -> int:
    return 4 if tile_m <= TILE_M else 8  # a 64-token tile's [64, 128] fp32 expand tile over 8 warps


def _block_r(max_rank: int) -> int:
    return min(_MAX_BLOCK_R, max(16, triton.next_power_of_2(max_rank)))


def sgmv_shrink(
    x: torch.Tensor,  # [T, in_features]
    a: torch.Tensor,  # [num_slices, num_slots, max_rank, in_features], last dim contiguous
    ranks: torch.Tensor,  # [num_slices, num_slots] int32: each slot's rank per slice (0: not targeted)
    tokens: torch.Tensor,  # [>= T] int32 (build_tiles)
    tiles: torch.Tensor,  # [3, >= max_tiles(T, num_slots, tile_m)] int32 (build_tiles with tile_m)
    reduce: bool = True,
    tile_m: int = TILE_M,  # the tiles' token count (build_tiles'): TILE_M or PREFILL_TILE_M
) -> torch.Tensor:  # [num_slices, T, max_rank] fp32; reduce False: [splits, num_slices, T, max_rank]
    """`out[i, t, :rank] = A[i, slot(t), :rank] @ x[t]` for every token in a tile (fp32 accumulation); rows
    of tokens in no tile (base model, padding) and columns past the rank are undefined. `reduce` False
    returns the split-K partials unsummed (`sgmv_expand` sums them as it reads them: one kernel fewer).
    Raises ValueError."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("a", a, 4, FLOAT_DTYPES)
    num_tokens, in_features = x.shape
    num_slices, num_slots, max_rank, a_in = a.shape
    if a_in != in_features:
        raise ValueError(f"a's in_features {a_in} != x's {in_features}")
    grid_tiles = _check_meta(tokens, tiles, ranks, num_tokens, num_slices, num_slots, tile_m)
    check_same_device(x=x, a=a, ranks=ranks, tokens=tokens, tiles=tiles)
    if not num_tokens:
        empty = torch.zeros(1, num_slices, 0, max_rank, dtype=torch.float32, device=x.device)
        return empty[0] if reduce else empty
    block_r = _block_r(max_rank)
    rank_blocks = triton.cdiv(max_rank, block_r)
    # split-K only when the tiles alone leave the GPU idle (a decode batch of a few tokens): each split
    # writes its own partial rows, summed below or by the expand (deterministic, no atomics). Static for a
    # given T, so a CUDA graph's grid is too.
    k_blocks = triton.cdiv(in_features, _BLOCK_K)
    wanted = min(k_blocks, _MAX_SPLITS, triton.cdiv(_TARGET_PROGRAMS, grid_tiles * num_slices * rank_blocks))
    splits = triton.next_power_of_2(max(1, wanted))  # splits past in_features store zeros
    k_chunk = triton.cdiv(k_blocks, splits) * _BLOCK_K
    partial = torch.empty(splits, num_slices, num_tokens, max_rank, dtype=torch.float32, device=x.device)
    grid = (grid_tiles, num_slices * rank_blocks, splits)
    _sgmv_shrink_kernel[grid](x, a, ranks, tokens, tiles, partial, in_features, k_chunk, rank_blocks,
                              tiles.stride(0), x.stride(0), a.stride(0), a.stride(1), a.stride(2), ranks.stride(0),
                              partial.stride(0), partial.stride(1), partial.stride(2), BLOCK_M=tile_m,
                              BLOCK_R=block_r, BLOCK_K=_BLOCK_K, FP32_DOT=_fp32_dot(x.dtype),
                              num_warps=_num_warps(tile_m))
    if not reduce:
        return partial
    return partial[0] if splits == 1 else partial.sum(0)


def sgmv_expand(
    y: torch.Tensor,  # [T, sum(slice sizes)], updated in place (row stride free, column stride 1)
    s: torch.Tensor,  # [num_slices, T, max_rank] fp32 (sgmv_shrink's output), or [splits, ...] unreduced
    b: torch.Tensor,  # [num_slots, max_rank, sum(slice sizes)] (B transposed, scaling folded in)
    ranks: torch.Tensor,  # [num_slices, num_slots] int32
    tokens: torch.Tensor,  # [>= T] int32
    tiles: torch.Tensor,  # [3, >= max_tiles(T, num_slots)] int32
    offsets: torch.Tensor,  # [num_slices + 1] int32 on the device: slice i is columns offsets[i]:offsets[i+1]
    max_slice: int,  # the widest slice's columns (sizes the grid; no device read)
    tile_m: int = TILE_M,  # the tiles' token count (as for sgmv_shrink)
) -> torch.Tensor:
    """`y[t, slice i] += B[slot(t), :rank, slice i]^T s[i, t, :rank]` for every token in a tile (fp32
    accumulation, rounded once to y.dtype); other rows untouched. Raises ValueError on bad shapes."""
    check_tensor("y", y, 2, FLOAT_DTYPES)
    if s.dim() == 3:
        s = s.unsqueeze(0)
    check_tensor("s", s, 4, (torch.float32,))
    check_tensor("b", b, 3, FLOAT_DTYPES)
    check_tensor("offsets", offsets, 1, (torch.int32,))
    num_tokens, out_features = y.shape
    num_slots, max_rank, b_out = b.shape
    num_slices = s.shape[1]
    if b_out != out_features or tuple(s.shape[2:]) != (num_tokens, max_rank):
        raise ValueError(f"shapes disagree: y {tuple(y.shape)}, s {tuple(s.shape)}, b {tuple(b.shape)}")
    if offsets.shape[0] != num_slices + 1 or not 0 < max_slice <= out_features:
        raise ValueError(f"offsets must have {num_slices + 1} entries and max_slice in [1, {out_features}]")
    grid_tiles = _check_meta(tokens, tiles, ranks, num_tokens, num_slices, num_slots, tile_m)
    check_same_device(y=y, s=s, b=b, ranks=ranks, tokens=tokens, tiles=tiles, offsets=offsets)
    if num_tokens:
        grid = (grid_tiles, triton.cdiv(max_slice, _BLOCK_N), num_slices)
        _sgmv_expand_kernel[grid](y, s, b, ranks, tokens, tiles, offsets, tiles.stride(0), y.stride(0),
                                  s.stride(0), s.stride(1), s.stride(2), b.stride(0), b.stride(1), ranks.stride(0),
                                  BLOCK_M=tile_m, NUM_SPLITS=s.shape[0],
                                  BLOCK_N=_BLOCK_N, BLOCK_R=_EXPAND_BLOCK_R, FP32_DOT=_fp32_dot(b.dtype),
                                  num_warps=_num_warps(tile_m))
    return y
