"""RMSNorm (optionally fused with the residual add), HF LlamaRMSNorm semantics."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import FLOAT_DTYPES, check_same_device, check_shape, check_tensor


def rms_norm_ref(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """HF LlamaRMSNorm: fp32 mean of squares, rsqrt(var + eps), cast back to x.dtype, times weight.

    With `residual`, r = x + residual (rounded to x.dtype) is normalized and returned as well.
    """
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight.float() * h.to(x.dtype).float()).to(x.dtype)
    return out if residual is None else (out, x)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, hidden, eps,
    stride_x, stride_r, stride_o, stride_ro,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, 0) / hidden
    h = (h * tl.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    out = w.to(tl.float32) * h.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden], same dtype as x
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """rms_norm(x) * weight in x.dtype.

    With `residual`: returns (rms_norm(r) * weight, r) where r = x + residual.
    Arithmetic in fp32; the sum x + residual is rounded to x.dtype before the norm, as HF does when
    it adds the residual in the model dtype. Rows may be strided; the hidden dim must be contiguous.
    Raises ValueError on bad shapes, dtypes or layouts.
    """
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("weight", weight, 1, FLOAT_DTYPES)
    num_tokens, hidden = x.shape
    check_shape("weight", weight, (hidden,))
    check_same_device(x=x, weight=weight)
    out = torch.empty_like(x)
    res_out = out
    if residual is not None:
        check_tensor("residual", residual, 2, (x.dtype,))
        check_shape("residual", residual, tuple(x.shape))
        check_same_device(x=x, residual=residual)
        res_out = torch.empty_like(x)
    if num_tokens > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(num_tokens,)](
            x, residual if residual is not None else x, weight, out, res_out, hidden, float(eps),
            x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0), res_out.stride(0),
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 512)),
        )  # fmt: skip
    return out if residual is None else (out, res_out)
