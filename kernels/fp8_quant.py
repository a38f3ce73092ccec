"""Dynamic per-token FP8 (e4m3) quantisation of activations in one kernel (the input of an FP8 linear layer).

Row r of `x [M, K]` gets `scale[r] = max(amax(|x[r]|), 1e-12) / 448` and `x_q[r] = fp8(x[r] / scale[r])`, the
same maths as the torch reference `quantize_per_token_ref` (bit-equal: IEEE divisions, the e4m3 rounding of
kernels/fp8.py). One program per row, two passes over K (amax, then quantise): one launch where the torch ops
take five (abs, amax, clamp, divide, cast), which matters at 4 linears x 32 layers per decode step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_tensor
from kernels.fp8 import FP8_DTYPE, FP8_MAX, ieee_div, round_to_e4m3

MIN_AMAX = 1e-12  # an all-zero row: any scale works, this one avoids 0 / 0


def quantize_per_token_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x [M, K]` -> (`x_q [M, K]` float8_e4m3fn, `scale [M, 1]` fp32), `x ~= float(x_q) * scale`."""
    scale = ieee_div(x.abs().amax(dim=-1, keepdim=True).float().clamp_min(MIN_AMAX), FP8_MAX)
    return ieee_div(x, scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


@triton.jit
def _quant_kernel(x_ptr, q_ptr, scale_ptr, K, stride_xm, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=k0 + offs < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = tl.math.div_rn(tl.maximum(tl.max(amax, 0), 1e-12), 448.0)
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + offs < K
        x = tl.load(x_ptr + row * stride_xm + k0 + offs, mask=mask, other=0.0)
        q = round_to_e4m3(tl.math.div_rn(x.to(tl.float32), scale))
        tl.store(q_ptr + row * K + k0 + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x [M, K]` (fp16/bf16/fp32, rows strided, last dim contiguous) -> (`x_q [M, K]` float8_e4m3fn contiguous,
    `scale [M, 1]` fp32), as `quantize_per_token_ref`. No host syncs (CUDA-graph safe).
    Raises ValueError on a bad rank, dtype or layout."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    m, k = x.shape
    x_q = torch.empty((m, k), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return x_q, scale.fill_(MIN_AMAX / FP8_MAX)
    block_k = min(1024, triton.next_power_of_2(k))
    _quant_kernel[(m,)](x, x_q, scale, k, x.stride(0), BLOCK_K=block_k, num_warps=4 if block_k >= 512 else 1)
    return x_q, scale
