"""FP8 (e4m3) linear layers for `quantization="fp8"` (vLLM's online `--quantization fp8`).

At load, each decoder linear weight `[out, in]` becomes float8_e4m3fn with one fp32 scale per output channel
(row): `w ~= float(w_q) * w_scale[:, None]`, `w_scale = amax(|row|) / 448`. At run time each token's activations
get their own scale the same way (dynamic, per token), and `torch._scaled_mm` multiplies the FP8 operands on
the tensor cores, applying both scales to the fp32 accumulator:

    y[m, n] = x_scale[m] * w_scale[n] * sum_k x_q[m, k] * w_q[n, k]

Per-channel and per-token scales (not per-tensor) keep one outlier row or token from flattening the others'
resolution. Embeddings, norms and the LM head stay in the model's dtype. The CUDA path needs compute capability
>= 8.9 (FP8 tensor cores: Ada, Hopper) and a bfloat16 model (`_scaled_mm`'s row-wise scaling writes bf16). The
CPU path refuses: the engine's CPU linears run in fp32 and FP8 there would only be emulated, slower and no
smaller in any way that matters; the quantisation maths is tested on the CPU against a float reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.fp8 import FP8_DTYPE, FP8_MAX  # noqa: F401 (re-exported)
from kernels.fp8_quant import quantize_per_token, quantize_per_token_ref


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x [rows, cols]` -> (`x_q [rows, cols]` float8_e4m3fn, `scale [rows, 1]` fp32) with
    `x ~= float(x_q) * scale`: each row's largest magnitude maps to 448 (no saturation by construction).
    On CUDA one Triton kernel (kernels/fp8_quant.py, bit-equal to the torch maths used elsewhere)."""
    return quantize_per_token(x) if x.is_cuda else quantize_per_token_ref(x)


def fp8_linear(
    x: torch.Tensor,  # [..., in_features], bfloat16 (CUDA) or any float dtype (CPU, tests)
    weight: torch.Tensor,  # [out_features, in_features] float8_e4m3fn
    weight_scale: torch.Tensor,  # [out_features] fp32
    bias: torch.Tensor | None = None,  # [out_features]
) -> torch.Tensor:  # [..., out_features], x.dtype
    """`x @ dequant(weight).T (+ bias)` with `x` quantised per token, through `torch._scaled_mm`."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.shape[0] == 0:
        return x.new_empty((*shape[:-1], weight.shape[0]))
    x_q, x_scale = quantize_rowwise(x2)
    out = scaled_mm_rowwise(x_q, weight.t(), x_scale, weight_scale.view(1, -1), x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*shape[:-1], weight.shape[0])


def scaled_mm_rowwise(
    a: torch.Tensor,  # [M, K] float8_e4m3fn, row-major
    b: torch.Tensor,  # [K, N] float8_e4m3fn, column-major (a row-major weight's .t())
    scale_a: torch.Tensor,  # [M, 1] fp32
    scale_b: torch.Tensor,  # [1, N] fp32
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [M, N] out_dtype: scale_a * scale_b * (a @ b), the scales applied to the fp32 accumulator
    """`torch._scaled_mm` with row-wise scales. CUDA: one call (FP8 tensor cores; K and N multiples of 16,
    bf16 out). CPU: torch before 2.13 takes only per-tensor scales there ("_scaled_mm only supports per-tensor
    scaling for CPU backend", torch 2.10/2.11), so the FP8 matmul runs with unit scales into fp32 and the
    scales are applied to that accumulator, then rounded to `out_dtype`: the same maths."""
    if a.is_cuda:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    one = torch.ones((), dtype=torch.float32)
    acc = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
    return (acc * scale_a * scale_b).to(out_dtype)


def fp8_linear_ref(x, weight, weight_scale, bias=None) -> torch.Tensor:
    """Emulated in fp32: quantise x per token (torch ops, on any device), dequantise both operands, plain matmul."""
    x_q, x_scale = quantize_per_token_ref(x.reshape(-1, x.shape[-1]))
    out = (x_q.float() * x_scale) @ (weight.float() * weight_scale.view(-1, 1)).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def apply_linear(layer: nn.Linear, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
    """The layer's matmul: FP8 when its weight was quantised (`quantize_linear_layers`), else `F.linear`."""
    bias = layer.bias if with_bias else None
    if layer.weight.dtype == FP8_DTYPE:
        return fp8_linear(x, layer.weight, layer.weight_scale, bias)
    return F.linear(x, layer.weight, bias)


def check_fp8_supported(device: torch.device, dtype: torch.dtype) -> None:
    """Raise ValueError naming `--quantization fp8` unless `device` can run it: CUDA with compute capability
    >= 8.9 and a bfloat16 model."""
    if device.type != "cuda":
        raise ValueError(
            f"--quantization fp8 (quantization='fp8') needs a CUDA GPU with FP8 tensor cores (compute capability "
            f">= 8.9: Ada, Hopper); this engine runs on {device.type}, where the linear layers run in fp32 and "
            f"have no FP8 matmul kernel. Drop the flag on the CPU (--kv-cache-dtype fp8 does run there)")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ValueError(f"--quantization fp8 needs compute capability >= 8.9 (FP8 tensor cores); "
                         f"{torch.cuda.get_device_name(device)} has {major}.{minor}")
    if dtype != torch.bfloat16:
        raise ValueError(f"--quantization fp8 needs --dtype bfloat16 (torch._scaled_mm's row-wise scaling writes "
                         f"bf16), got {dtype}")


@torch.no_grad()
def quantize_linear_layers(model: nn.Module) -> int:
    """Replace every tensor-parallel linear's weight (q/k/v, o, gate/up, down) by float8_e4m3fn plus a
    `weight_scale [out_features]` fp32 buffer, in place, one layer at a time (the bf16 copy is freed as it
    goes). Returns the number of layers quantised."""
    from shared_engine.model_executor.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear

    count = 0
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear | RowParallelLinear) and module.weight.dtype != FP8_DTYPE:
            w_q, scale = quantize_rowwise(module.weight.data)
            module.weight = nn.Parameter(w_q, requires_grad=False)
            module.register_buffer("weight_scale", scale.view(-1).contiguous())
            count += 1
    return count
