"""FP8 (e4m3, `torch.float8_e4m3fn`) KV cache values: per-tensor scales, saturating quantisation, references.

A cached value is stored as `q = fp8(clamp(x / scale, -448, 448))` and read as `x' = float(q) * scale`. e4m3
keeps 3 mantissa bits (relative rounding error <= 2^-4 = 6.25% for normal values, |q| in [2^-6, 448]; below
2^-6 subnormals down to 2^-9) and has no infinities: values beyond +-448 saturate to +-448 here (an unclamped
cast may give NaN on some paths), so an outlier past `448 * scale` is clipped, never NaN.

The attention kernels never dequantise a whole tile: casting e4m3 to bf16/fp16/fp32 is exact, so a kernel
casts K/V to q's dtype, folds `k_scale` into the softmax scale (q . (k * s) = s * (q . k)) and multiplies its
output by `v_scale` (sum_j p_j (v_j * s) = s * sum_j p_j v_j). Scales are python floats: per layer, K and V
separately (vLLM's `k_scale` / `v_scale`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KV_CACHE_DTYPES = (*FLOAT_DTYPES, FP8_DTYPE)


def ieee_div(x: torch.Tensor, divisor: float | torch.Tensor) -> torch.Tensor:
    """`x / divisor` in fp32, correctly rounded on every device, as the kernels' `tl.math.div_rn`. (On CUDA,
    torch divides by a python number or a CPU scalar as `x * (1 / divisor)`, which differs in the last bit
    for about 1 in 4 inputs, e.g. `amax / 448`; a divisor tensor on x's device is divided elementwise.)"""
    if not torch.is_tensor(divisor) or divisor.device != x.device:
        divisor = torch.full((), float(divisor), dtype=torch.float32, device=x.device)
    return x.float() / divisor


def quantize_fp8_ref(x: torch.Tensor, scale: float) -> torch.Tensor:  # same shape, float8_e4m3fn
    """`fp8(clamp(x / scale, -448, 448))`, computed in fp32 (IEEE division, round to nearest even). Raises
    ValueError for a scale that is not a positive finite number."""
    check_scale("scale", scale)
    return ieee_div(x, scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8_ref(q: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`float(q) * scale` in `dtype` (q: float8_e4m3fn)."""
    return (q.float() * scale).to(dtype)


def read_cache(cache: torch.Tensor, scale: float) -> torch.Tensor:
    """A KV cache (or a gather of it) in fp32: fp8 dequantised with `scale`, float caches as they are."""
    return cache.float() * scale if cache.dtype == FP8_DTYPE else cache.float()


def check_scale(name: str, scale: float) -> None:
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not (0.0 < float(scale) < float("inf")):
        raise ValueError(f"{name} must be a positive finite python float, got {scale!r}")


@triton.jit
def round_to_e4m3(x):
    """fp32 -> fp32 on the e4m3fn grid: saturated at +-448, rounded to nearest even (what the hardware cast of
    an out-of-grid value does), so the cast to float8e4nv that follows is exact. Rounding here, not in the cast,
    because Triton's interpreter rounds the cast without carrying into the exponent (31.9 became 16, not 32)."""
    x = tl.clamp(x, -448.0, 448.0)
    a = tl.abs(x)
    bits = a.to(tl.int32, bitcast=True)
    # normal values (>= 2^-6): keep 3 of fp32's 23 mantissa bits, ties to even; a carry moves into the exponent
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    # subnormals: multiples of 2^-9, by adding 2^14 (whose fp32 ulp is 2^-9; fp32 addition rounds to even)
    sub = (a + 16384.0) - 16384.0
    r = tl.where(a >= 0.015625, normal, sub)
    sign = x.to(tl.int32, bitcast=True) & -0x80000000  # -0.0 stays -0.0
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
