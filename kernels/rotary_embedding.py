"""Rotary position embedding, neox style (rotate_half, as HF Llama/Qwen), applied in place to q and k.

The cos/sin cache is built in pure torch by `build_cos_sin_cache` ("default" and "llama3" rope types,
following HF transformers' `_compute_default_rope_parameters` / `_compute_llama3_parameters`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_same_device, check_tensor


def _llama3_inv_freq(inv_freq: torch.Tensor, rope_scaling: dict) -> torch.Tensor:
    factor = rope_scaling["factor"]
    low_freq_factor = rope_scaling["low_freq_factor"]
    high_freq_factor = rope_scaling["high_freq_factor"]
    old_context_len = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are divided by `factor`, short ones kept, the band between interpolated smoothly
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def build_cos_sin_cache(
    head_dim: int, max_position: int, rope_theta: float, rope_scaling: dict | None = None
) -> torch.Tensor:  # [max_position, head_dim] float32: cos in [:, :head_dim // 2], sin in [:, head_dim // 2:]
    """cos/sin of position * inv_freq for positions 0..max_position-1 (CPU fp32; move it to the device).

    rope_scaling: None or a HF config dict with "rope_type" (or legacy "type") "default" or "llama3".
    Raises ValueError for other rope types or an odd head_dim.
    """
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    rope_type = "default"
    if rope_scaling is not None:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    inv_freq = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope_scaling)
    elif rope_type != "default":
        raise ValueError(f"unsupported rope_type {rope_type!r}: expected 'default' or 'llama3'")
    freqs = torch.outer(torch.arange(max_position, dtype=torch.int64).float(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rotary_embedding_ref(
    positions: torch.Tensor,  # [num_tokens] int64
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim] float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference (returns new tensors): x * cos + rotate_half(x) * sin in fp32."""
    half = cos_sin_cache.shape[1] // 2
    cos_sin = cos_sin_cache[positions.long()].float()
    cos = torch.cat([cos_sin[:, :half]] * 2, -1)[:, None, :]  # [num_tokens, 1, head_dim]
    sin = torch.cat([cos_sin[:, half:]] * 2, -1)[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    return rotate(q).to(q.dtype), rotate(k).to(k.dtype)


@triton.jit
def _rotate_heads(
    x_ptr, stride_t, stride_h, token, cos, sin, num_heads, HALF: tl.constexpr, HEADS_PAD: tl.constexpr
):
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HALF)
    mask = offs_h[:, None] < num_heads
    ptrs = x_ptr + token * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
    num_q_heads, num_kv_heads, HALF: tl.constexpr, Q_PAD: tl.constexpr, K_PAD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token)
    offs_d = tl.arange(0, HALF)
    cos = tl.load(cache_ptr + pos * stride_c + offs_d)[None, :]
    sin = tl.load(cache_ptr + pos * stride_c + HALF + offs_d)[None, :]
    _rotate_heads(q_ptr, stride_qt, stride_qh, token, cos, sin, num_q_heads, HALF, Q_PAD)
    _rotate_heads(k_ptr, stride_kt, stride_kh, token, cos, sin, num_kv_heads, HALF, K_PAD)


def apply_rotary_embedding(
    positions: torch.Tensor,  # [num_tokens] int64 (int32 accepted)
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim] float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place by their token's position; returns (q, k).

    q/k may be strided views (e.g. of a fused qkv tensor) with contiguous head_dim; head_dim must be
    a power of two >= 2. Positions must be < max_position (not checked: no host sync).
    Raises ValueError on bad shapes, dtypes or layouts.
    """
    check_tensor("positions", positions, 1, (torch.int64, torch.int32))
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check_tensor("cos_sin_cache", cos_sin_cache, 2, (torch.float32,), contiguous=True)
    check_same_device(positions=positions, q=q, k=k, cos_sin_cache=cos_sin_cache)
    num_tokens, num_q_heads, head_dim = q.shape
    if k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(f"k must be [{num_tokens}, num_kv_heads, {head_dim}], got {tuple(k.shape)}")
    if positions.shape[0] != num_tokens:
        raise ValueError(f"positions must have {num_tokens} entries, got {positions.shape[0]}")
    if cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_position, {head_dim}], got {tuple(cos_sin_cache.shape)}"
        )
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 2, got {head_dim}")
    if num_tokens > 0:
        _rotary_kernel[(num_tokens,)](
            positions, q, k, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            cos_sin_cache.stride(0), num_q_heads, k.shape[1], HALF=head_dim // 2,
            Q_PAD=triton.next_power_of_2(num_q_heads), K_PAD=triton.next_power_of_2(k.shape[1]),
            num_warps=4,
        )  # fmt: skip
    return q, k
