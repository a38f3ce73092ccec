"""SwiGLU activation: silu(gate) * up, with gate and up the two halves of one projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_tensor


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, 2 * d] -> [num_tokens, d]
    """Pure-torch reference, computed in fp32 and rounded once to x.dtype."""
    d = x.shape[-1] // 2
    return (F.silu(x[:, :d].float()) * x[:, d:].float()).to(x.dtype)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(
    x: torch.Tensor,  # [num_tokens, 2 * intermediate]: gate in the first half, up in the second
    out: torch.Tensor | None = None,  # [num_tokens, intermediate]
) -> torch.Tensor:  # [num_tokens, intermediate], x.dtype
    """silu(gate) * up in fp32, rounded once to x.dtype. Raises ValueError on bad shapes or layouts."""
    check_tensor("x", x, 2, FLOAT_DTYPES)
    num_tokens, two_d = x.shape
    if two_d % 2 != 0:
        raise ValueError(f"x's last dim must be even (gate and up halves), got {two_d}")
    d = two_d // 2
    if out is None:
        out = torch.empty(num_tokens, d, dtype=x.dtype, device=x.device)
    check_tensor("out", out, 2, (x.dtype,))
    if tuple(out.shape) != (num_tokens, d):
        raise ValueError(f"out must have shape {(num_tokens, d)}, got {tuple(out.shape)}")
    if num_tokens > 0 and d > 0:
        block = min(1024, triton.next_power_of_2(d))
        _silu_and_mul_kernel[(num_tokens, triton.cdiv(d, block))](
            x, out, d, x.stride(0), out.stride(0), BLOCK=block, num_warps=4
        )
    return out
