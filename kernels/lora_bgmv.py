"""Batched LoRA for mixed-adapter batches: per-token shrink and expand (Punica's BGMV, Chen et al. 2023,
https://arxiv.org/abs/2310.18547; S-LoRA's mixed ranks, Sheng et al. 2023, https://arxiv.org/abs/2311.03285).

Each token t runs on the adapter in slot `slots[t]` (-1: the base model, no delta):

    shrink:  s[t, :]  = A[slots[t]] @ x[t]          A [num_slots, max_rank, in],  s [T, max_rank] (fp32)
    expand:  y[t, :] += B[slots[t]] @ s[t]          B [num_slots, max_rank, out] (B transposed, scaled)

Only each token's own slot is read (the torch path, layers/lora.py, multiplies by every slot and masks).
Mixed ranks in one batch: `ranks[slot]` rows of a slot are used; the slot's rows past its rank are never
read (they are zero in the layers' buffers anyway). `slots` and `ranks` are device tensors read by the
kernels, so a CUDA graph captured once replays any adapter mix of the same token count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_same_device, check_tensor

_K_CHUNK = 512  # in_features per shrink program (split-K)


def lora_shrink_ref(x, a, slots, ranks):  # x [T, in], a [S, R, in], slots [T], ranks [S] -> [T, R] fp32
    """Pure-torch reference: fp32 products, zero for base-model tokens and past each slot's rank."""
    out = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            r = int(ranks[s])
            out[t, :r] = a[s, :r].float() @ x[t].float()
    return out


def lora_expand_ref(y, s, b, slots, ranks):  # y [T, out] (+=), s [T, R] fp32, b [S, R, out]
    """Pure-torch reference: y[t] + B[slot]^T s[t] in fp32, rounded once to y.dtype."""
    out = y.float().clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            r = int(ranks[slot])
            out[t] += s[t, :r] @ b[slot, :r].float()
    return out.to(y.dtype)


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slots_ptr, ranks_ptr, out_ptr, in_features, max_rank, k_chunk, stride_x,
                   stride_as, stride_ar, stride_os, stride_ot, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    # program (token, rank block, split): the split's chunk of in_features, written to its own partial row
    t = tl.program_id(0).to(tl.int64)
    r_offs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(2)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    rank = tl.where(slot >= 0, tl.load(ranks_ptr + tl.maximum(slot, 0)), 0)  # base-model tokens: rank 0
    r_mask = r_offs < rank
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if rank > tl.program_id(1) * BLOCK_R:
        a_base = a_ptr + tl.maximum(slot, 0) * stride_as + r_offs[:, None] * stride_ar
        k_end = tl.minimum(in_features, (split + 1) * k_chunk)
        for k in range(split * k_chunk, k_end, BLOCK_K):
            k_offs = k + tl.arange(0, BLOCK_K)
            k_mask = k_offs < k_end
            xv = tl.load(x_ptr + t * stride_x + k_offs, mask=k_mask, other=0.0).to(tl.float32)
            av = tl.load(a_base + k_offs[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(out_ptr + split * stride_os + t * stride_ot + r_offs, acc, mask=r_offs < max_rank)


@triton.jit
def _expand_kernel(y_ptr, s_ptr, b_ptr, slots_ptr, ranks_ptr, out_features, max_rank, stride_y, stride_s,
                   stride_bs, stride_br, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    n_offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n_offs < out_features
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot >= 0:
        rank = tl.load(ranks_ptr + slot)
        r_offs = tl.arange(0, BLOCK_R)
        r_mask = (r_offs < rank) & (r_offs < max_rank)
        sv = tl.load(s_ptr + t * stride_s + r_offs, mask=r_mask, other=0.0)
        bv = tl.load(b_ptr + slot * stride_bs + r_offs[:, None] * stride_br + n_offs[None, :],
                     mask=r_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
        delta = tl.sum(bv * sv[:, None], axis=0)
        y = tl.load(y_ptr + t * stride_y + n_offs, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + t * stride_y + n_offs, (y + delta).to(y_ptr.dtype.element_ty), mask=n_mask)


def _check_index(slots: torch.Tensor, ranks: torch.Tensor, num_tokens: int, num_slots: int) -> None:
    check_tensor("slots", slots, 1, (torch.int32, torch.int64))
    check_tensor("ranks", ranks, 1, (torch.int32, torch.int64))
    if slots.shape[0] < num_tokens:
        raise ValueError(f"slots must have >= {num_tokens} entries (one per token), got {slots.shape[0]}")
    if ranks.shape[0] != num_slots:
        raise ValueError(f"ranks must have {num_slots} entries (one per slot), got {ranks.shape[0]}")


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_features]
    a: torch.Tensor,  # [num_slots, max_rank, in_features], rows contiguous
    slots: torch.Tensor,  # [>= num_tokens] int: each token's slot, -1 = base model
    ranks: torch.Tensor,  # [num_slots] int: each slot's rank (<= max_rank)
) -> torch.Tensor:  # [num_tokens, max_rank] fp32
    """`out[t] = A[slots[t]][:rank] @ x[t]` (fp32; zero elsewhere). Raises ValueError on bad shapes."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("a", a, 3, FLOAT_DTYPES)
    num_tokens, in_features = x.shape
    num_slots, max_rank, a_in = a.shape
    if a_in != in_features:
        raise ValueError(f"a's in_features {a_in} != x's {in_features}")
    _check_index(slots, ranks, num_tokens, num_slots)
    check_same_device(x=x, a=a, slots=slots, ranks=ranks)
    if not num_tokens:
        return torch.zeros(0, max_rank, dtype=torch.float32, device=x.device)
    # split-K: one token's shrink is a long dot product per rank row; one program per token would run it
    # serially on one SM (a batch-1 decode step then waits on a handful of programs). Each split writes its
    # own partial row, summed below: deterministic, no atomics.
    splits = triton.cdiv(in_features, _K_CHUNK)
    partial = torch.empty(splits, num_tokens, max_rank, dtype=torch.float32, device=x.device)
    block_r = min(16, triton.next_power_of_2(max_rank))
    grid = (num_tokens, triton.cdiv(max_rank, block_r), splits)
    _shrink_kernel[grid](x, a, slots, ranks, partial, in_features, max_rank, _K_CHUNK, x.stride(0), a.stride(0),
                         a.stride(1), partial.stride(0), partial.stride(1), BLOCK_R=block_r, BLOCK_K=128,
                         num_warps=4)
    return partial.sum(0)


def lora_expand(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place (may be a column slice)
    s: torch.Tensor,  # [num_tokens, max_rank] fp32 (lora_shrink's output)
    b: torch.Tensor,  # [num_slots, max_rank, out_features] (B transposed, scaling folded in)
    slots: torch.Tensor,  # [>= num_tokens] int, -1 = base model
    ranks: torch.Tensor,  # [num_slots] int
) -> torch.Tensor:
    """`y[t] += B[slots[t]][:rank]^T s[t][:rank]` in fp32, rounded once to y.dtype. Raises ValueError."""
    check_tensor("y", y, 2, FLOAT_DTYPES)
    check_tensor("s", s, 2, (torch.float32,))
    check_tensor("b", b, 3, FLOAT_DTYPES)
    num_tokens, out_features = y.shape
    num_slots, max_rank, b_out = b.shape
    if b_out != out_features or tuple(s.shape) != (num_tokens, max_rank):
        raise ValueError(f"shapes disagree: y {tuple(y.shape)}, s {tuple(s.shape)}, b {tuple(b.shape)}")
    _check_index(slots, ranks, num_tokens, num_slots)
    check_same_device(y=y, s=s, b=b, slots=slots, ranks=ranks)
    if num_tokens:
        block_n = min(256, triton.next_power_of_2(out_features))
        grid = (num_tokens, triton.cdiv(out_features, block_n))
        _expand_kernel[grid](y, s, b, slots, ranks, out_features, max_rank, y.stride(0), s.stride(0), b.stride(0),
                             b.stride(1), BLOCK_N=block_n, BLOCK_R=triton.next_power_of_2(max_rank), num_warps=4)
    return y
