"""The physical bound for an offline workload: bytes over copy bandwidth vs FLOPs over matmul rate.

Used by the GPU benchmarks (and stated in their results files). Over the whole run:

    time >= max(bytes / copy_bandwidth, flops / matmul_rate)

bytes: the weights, read once per step, plus the KV cache read by every token (a decode token reads its
whole context; a prompt is read once per request, as a flash-style prefill kernel does) and written once;
steps: decode steps at the batch size the KV pool allows (`min(max_num_seqs, kv_tokens // (in + out))`).
flops: 2 * parameters per token (matmuls), plus attention's 4 * layers * heads * head_dim per (query, key)
pair. Sources: the roofline model (Williams, Waterman & Patterson, CACM 2009); the figures of merit
(copy bandwidth, matmul rate) are measured on the device in the same run.

FP8 (issue 23): `kv_cache_dtype="fp8"` prices KV bytes at 1 byte per element; `weight_dtype="fp8"` prices the
decoder's linear weights (q/k/v, o, gate/up, down: what `--quantization fp8` quantises) at 1 byte and their
FLOPs at the FP8 matmul rate, while embeddings, LM head and norms keep the model's dtype and rate, and
attention's FLOPs stay at the bf16 rate (the kernels compute in bf16 over a dequantised FP8 cache).
"""

from __future__ import annotations

from shared_engine.model_arch import DTYPE_BYTES, ModelArch

# Dense FP8 tensor-core rate of an H200 SXM by NVIDIA's datasheet (3,958 TFLOP/s with 2:4 sparsity): the stated
# constant when no measurement is given; `measure_device_ceilings` measures it (torch._scaled_mm, 8192^3).
FP8_MATMUL_FLOPS_H200_DATASHEET = 1.979e15


def linear_parameters(arch: ModelArch) -> int:
    """Parameters of the decoder's linear layers (q/k/v, o, gate/up, down), all layers; the rest of
    `num_parameters` is embeddings, LM head and norms."""
    h, i, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    attn = h * d * (arch.num_heads + 2 * arch.num_kv_heads) + arch.num_heads * d * h
    return arch.num_layers * (attn + 3 * h * i)


def model_weight_bytes(arch: ModelArch, dtype: str, weight_dtype: str | None = None) -> int:
    """Bytes of all weights: linear layers in `weight_dtype` (default `dtype`), the rest in `dtype`
    (per-channel FP8 scales, 4 bytes per output channel, are below 0.01% and left out)."""
    linear = linear_parameters(arch)
    return linear * DTYPE_BYTES[weight_dtype or dtype] + (arch.num_parameters - linear) * DTYPE_BYTES[dtype]


def offline_roofline(arch: ModelArch, dtype: str, num_requests: int, input_len: float, output_len: float,
                     kv_pool_tokens: int, max_num_seqs: int, copy_bandwidth: float, matmul_flops: float,
                     kv_cache_dtype: str | None = None, weight_dtype: str | None = None,
                     fp8_matmul_flops: float | None = None) -> dict:
    """Bound for `num_requests` requests of mean `input_len` / `output_len` tokens.

    copy_bandwidth in bytes/s (read + written), matmul_flops (the model dtype's rate) and fp8_matmul_flops in
    FLOP/s. `kv_cache_dtype` / `weight_dtype`: None (the model's dtype) or "fp8"; `weight_dtype="fp8"` needs
    `fp8_matmul_flops` (measured, or FP8_MATMUL_FLOPS_H200_DATASHEET stated). Returns the terms and
    `output_tokens_per_s_bound`. Raises ValueError for fp8 weights without an FP8 rate.
    """
    if weight_dtype == "fp8" and not fp8_matmul_flops:
        raise ValueError("weight_dtype='fp8' needs fp8_matmul_flops (measured, or FP8_MATMUL_FLOPS_H200_DATASHEET)")
    kv_bpt = arch.kv_bytes_per_token(kv_cache_dtype or dtype)
    per_request = input_len + output_len
    batch = max(1, min(max_num_seqs, int(kv_pool_tokens // per_request), num_requests))
    output_tokens = num_requests * output_len
    decode_steps = output_tokens / batch
    weight_bytes = model_weight_bytes(arch, dtype, weight_dtype)
    # decode token t of a request reads input_len + t cached tokens; a prompt is read once and written once
    decode_kv_read = num_requests * output_len * (input_len + output_len / 2) * kv_bpt
    prefill_kv = num_requests * 2 * input_len * kv_bpt
    kv_write = num_requests * output_len * kv_bpt
    total_bytes = decode_steps * weight_bytes + decode_kv_read + prefill_kv + kv_write
    attn_per_pair = 4 * arch.num_layers * arch.num_heads * arch.head_dim
    pairs = num_requests * (input_len * input_len / 2 + output_len * (input_len + output_len / 2))
    tokens = num_requests * per_request
    linear_flops = 2 * linear_parameters(arch) * tokens
    other_flops = 2 * (arch.num_parameters - linear_parameters(arch)) * tokens + attn_per_pair * pairs
    flops = linear_flops + other_flops
    linear_rate = fp8_matmul_flops if weight_dtype == "fp8" else matmul_flops
    memory_s, compute_s = total_bytes / copy_bandwidth, linear_flops / linear_rate + other_flops / matmul_flops
    bound_s = max(memory_s, compute_s)
    return {
        "batch_size": batch, "decode_steps": decode_steps, "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_bpt, "total_bytes": total_bytes, "total_flops": flops,
        "linear_flops": linear_flops, "kv_cache_dtype": kv_cache_dtype or dtype, "weight_dtype": weight_dtype or dtype,
        "linear_matmul_flops_per_s": linear_rate,
        "memory_time_s": memory_s, "compute_time_s": compute_s, "bound_time_s": bound_s,
        "bound": "memory" if memory_s >= compute_s else "compute",
        "output_tokens_per_s_bound": output_tokens / bound_s,
    }


def measure_device_ceilings(device: str = "cuda") -> dict:
    """Copy bandwidth (bytes read + written per second, 1 GiB buffers), bf16 matmul rate (8192^3) and, on
    compute capability >= 8.9, the FP8 rate of the engine's own call (torch._scaled_mm, e4m3 operands, row-wise
    scales, bf16 out, 8192^3); medians of CUDA-event timings on random data."""
    import torch
    import triton.testing

    src = torch.randn(2**29, dtype=torch.bfloat16, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    mm_ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    out = {"copy_bandwidth_bytes_per_s": 2 * 2**30 / (copy_ms / 1e3),
           "matmul_bf16_flops_per_s": 2 * 8192**3 / (mm_ms / 1e3)}
    if torch.cuda.get_device_capability(device) >= (8, 9):
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)  # b8.t(): column-major, as _scaled_mm wants
        sa = torch.ones(8192, 1, device=device)
        sb = torch.ones(1, 8192, device=device)
        fp8_ms = triton.testing.do_bench(
            lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
            warmup=50, rep=300, return_mode="median")
        out["matmul_fp8_flops_per_s"] = 2 * 8192**3 / (fp8_ms / 1e3)
    torch.cuda.empty_cache()
    return out
