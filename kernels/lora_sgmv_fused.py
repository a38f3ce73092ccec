"""The fused LoRA shrink + expand for steps of a few tokens (batch-1 decodes): one launch per projection
instead of `kernels/lora_sgmv.py`'s two, on the same metadata (`build_tiles`, `TILE_M` tiles) and buffers.
OFF by default (`FUSED_MAX_TOKENS` 0): measured slower than the two kernels on the H200 (below).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_same_device, check_tensor
from kernels.lora_sgmv import _BLOCK_N, _EXPAND_BLOCK_R, TILE_M, _check_meta, _fp32_dot

# steps of at most this many tokens run sgmv_fused (one launch per projection); LORA_FUSED_MAX_TOKENS sets it
# (0: never; A/B runs of bench_lora.py / bench_lora_kernels.py on a GPU). Default 0 (OFF): on the H200 at
# 8ea6fb5 batch-1 ITL with it on was 5.403 ms (+15.7% over base) against 5.244 ms (+12.7%) with the two
# kernels at c518670 (benchmarks/results/lora_h200_llama8b_8ea6fb5.json, ..._c518670.json): slower, not faster.
FUSED_MAX_TOKENS = int(os.environ.get("LORA_FUSED_MAX_TOKENS", "0"))
# ... for inputs of at most this many features: a program's shrink walks all of in_features alone, so
# down_proj's 14,336 keeps the split-K shrink and the separate expand
FUSED_MAX_IN_FEATURES = 8192
_FUSED_BLOCK_K = 256  # in_features per step of the fused kernel's shrink loop (16 steps for 4,096)


@triton.jit
def _sgmv_fused_kernel(y_ptr, x_ptr, a_ptr, b_ptr, ranks_ptr, tokens_ptr, tiles_ptr, offsets_ptr, in_features,
                       stride_tiles, stride_x, stride_ai, stride_as, stride_ar, stride_bs, stride_br, stride_y,
                       stride_ranks, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr):
    # program (tile, column block of the slice, slice): the tile's shrink over all of in_features, then its
    # expand into the column block; every column block of a tile recomputes the same shrink (a few tokens:
    # their x rows and the slot's A are read from L2), so one launch does what shrink + expand did in two
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
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, rank, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            r_mask = r < rank
            a_base = a_ptr + sl.to(tl.int64) * stride_ai + slot.to(tl.int64) * stride_as + r[None, :] * stride_ar
            sv = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for k in range(0, in_features, BLOCK_K):
                k_offs = k + tl.arange(0, BLOCK_K)
                k_mask = k_offs < in_features
                xv = tl.load(x_ptr + tok[:, None] * stride_x + k_offs[None, :],
                             mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                av = tl.load(a_base + k_offs[:, None], mask=k_mask[:, None] & r_mask[None, :], other=0.0).to(xv.dtype)
                if FP32_DOT:
                    sv += tl.dot(xv.to(tl.float32), av.to(tl.float32), input_precision="ieee")
                else:
                    sv += tl.dot(xv, av)
            bv = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + r[:, None] * stride_br + n[None, :],
                         mask=r_mask[:, None] & n_mask[None, :], other=0.0)
            if FP32_DOT:
                acc += tl.dot(sv, bv.to(tl.float32), input_precision="ieee")
            else:  # as the two-kernel path: the fp32 shrink rounded to B's dtype, fp32 accumulation
                acc += tl.dot(sv.to(bv.dtype), bv)
        y = y_ptr + tok[:, None] * stride_y + n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
        yv = tl.load(y, mask=mask, other=0.0).to(tl.float32)
        tl.store(y, (yv + acc).to(y_ptr.dtype.element_ty), mask=mask)


def sgmv_fused(
    y: torch.Tensor,  # [T, sum(slice sizes)], updated in place
    x: torch.Tensor,  # [T, in_features]
    a: torch.Tensor,  # [num_slices, num_slots, max_rank, in_features]
    b: torch.Tensor,  # [num_slots, max_rank, sum(slice sizes)]
    ranks: torch.Tensor,  # [num_slices, num_slots] int32
    tokens: torch.Tensor,  # [>= T] int32 (build_tiles, TILE_M tiles)
    tiles: torch.Tensor,  # [3, >= max_tiles(T, num_slots)] int32
    offsets: torch.Tensor,  # [num_slices + 1] int32 on the device
    max_slice: int,
) -> torch.Tensor:
    """`sgmv_shrink` then `sgmv_expand` in one launch, for steps of at most FUSED_MAX_TOKENS tokens (batch-1
    decodes: the two launches' fixed cost was most of their time, 3.8 + 4.7 us per projection on the H200
    at c518670). Each program recomputes its tile's shrink, so the cost grows with tiles x column blocks:
    not for large steps. Same rounding as the two kernels (fp32 shrink, rounded once to B's dtype for the
    expand's tensor-core dot; fp32 accumulation). Raises ValueError on bad shapes."""
    check_tensor("y", y, 2, FLOAT_DTYPES)
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("a", a, 4, FLOAT_DTYPES)
    check_tensor("b", b, 3, FLOAT_DTYPES)
    check_tensor("offsets", offsets, 1, (torch.int32,))
    num_tokens, in_features = x.shape
    num_slices, num_slots, max_rank, a_in = a.shape
    if a_in != in_features or y.shape[0] != num_tokens or tuple(b.shape) != (num_slots, max_rank, y.shape[1]):
        raise ValueError(f"shapes disagree: y {tuple(y.shape)}, x {tuple(x.shape)}, a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}")
    if offsets.shape[0] != num_slices + 1 or not 0 < max_slice <= y.shape[1]:
        raise ValueError(f"offsets must have {num_slices + 1} entries and max_slice in [1, {y.shape[1]}]")
    grid_tiles = _check_meta(tokens, tiles, ranks, num_tokens, num_slices, num_slots, TILE_M)
    check_same_device(y=y, x=x, a=a, b=b, ranks=ranks, tokens=tokens, tiles=tiles, offsets=offsets)
    if num_tokens:
        grid = (grid_tiles, triton.cdiv(max_slice, _BLOCK_N), num_slices)
        _sgmv_fused_kernel[grid](y, x, a, b, ranks, tokens, tiles, offsets, in_features, tiles.stride(0), x.stride(0),
                                 a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1), y.stride(0),
                                 ranks.stride(0), BLOCK_M=TILE_M, BLOCK_N=_BLOCK_N, BLOCK_R=_EXPAND_BLOCK_R,
                                 BLOCK_K=_FUSED_BLOCK_K, FP32_DOT=_fp32_dot(x.dtype), num_warps=4)
    return y
