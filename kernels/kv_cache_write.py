"""Write the new tokens' K and V into the paged KV cache at their flat slots (an FP8 cache: quantised with the
layer's k/v scale and saturated at +-448, see kernels/fp8.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_same_device, check_shape, check_tensor
from kernels.fp8 import FP8_DTYPE, KV_CACHE_DTYPES, check_scale, quantize_fp8_ref, round_to_e4m3


def write_kv_cache_ref(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, slot = block * block_size + offset; < 0: skip
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Pure-torch reference (in place on the caches); an FP8 cache stores `quantize_fp8_ref(x, scale)`."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if cache.dtype == FP8_DTYPE:  # through a uint8 view: the CPU has no fp8 index_put
            quantised = quantize_fp8_ref(x[keep], scale).view(torch.uint8)
            cache.view(torch.uint8).view(-1, *cache.shape[2:])[slots] = quantised
        else:
            cache.view(-1, *cache.shape[2:])[slots] = x[keep].to(cache.dtype)


@triton.jit
def _kv_write_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, k_scale, v_scale,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
    QUANT: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot < 0:
        return
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, DIM_PAD)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HEAD_DIM)
    cache_off = slot * (NUM_HEADS * HEAD_DIM) + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    t = token.to(tl.int64)
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    if QUANT:  # FP8 cache: scale (IEEE division, as the reference), saturate (e4m3fn has no inf), round
        k = round_to_e4m3(tl.math.div_rn(k.to(tl.float32), k_scale))
        v = round_to_e4m3(tl.math.div_rn(v.to(tl.float32), v_scale))
    tl.store(k_cache_ptr + cache_off, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_off, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Copy token t's K/V into flat cache slot `slot_mapping[t]` (skipped when negative), in place.

    k/v may be strided views (e.g. slices of a fused qkv tensor) as long as head_dim is contiguous; they
    are cast to the cache dtype. An FP8 cache (both caches float8_e4m3fn) stores
    `fp8(clamp(x / scale, -448, 448))` with `k_scale` / `v_scale` (positive python floats; ignored otherwise).
    Slots must be < num_blocks * block_size (not checked: no host sync).
    Raises ValueError on bad shapes, dtypes, layouts or scales.
    """
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check_tensor("v", v, 3, FLOAT_DTYPES)
    check_tensor("k_cache", k_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    check_tensor("v_cache", v_cache, 4, KV_CACHE_DTYPES, contiguous=True)
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache dtypes differ: {k_cache.dtype}, {v_cache.dtype}")
    check_scale("k_scale", k_scale)
    check_scale("v_scale", v_scale)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    check_shape("v", v, tuple(k.shape))
    check_shape("slot_mapping", slot_mapping, (num_tokens,))
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"k_cache must be [num_blocks, block_size, {num_kv_heads}, {head_dim}], got {list(k_cache.shape)}"
        )
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if num_tokens == 0:
        return
    _kv_write_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        float(k_scale), float(v_scale), NUM_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads), DIM_PAD=triton.next_power_of_2(head_dim),
        QUANT=k_cache.dtype == FP8_DTYPE,
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )  # fmt: skip
