"""The physical bound for an offline workload: bytes over copy bandwidth vs FLOPs over matmul rate.

Used by the GPU benchmarks (and stated in their results files). Over the whole run:

    time >= max(bytes / copy_bandwidth, flops / matmul_rate)

bytes: the weights, read once per step, plus the KV cache read by every token (a decode token reads its
whole context; a prompt is read once per request, as a flash-style prefill kernel does) and written once;
steps: decode steps at the batch size the KV pool allows (`min(max_num_seqs, kv_tokens // (in + out))`).
flops: 2 * parameters per token (matmuls), plus attention's 4 * layers * heads * head_dim per (query, key)
pair. Sources: the roofline model (Williams, Waterman & Patterson, CACM 2009); the figures of merit
(copy bandwidth, matmul rate) are measured on the device in the same run.
"""

from __future__ import annotations

from shared_engine.model_arch import DTYPE_BYTES, ModelArch


def offline_roofline(arch: ModelArch, dtype: str, num_requests: int, input_len: float, output_len: float,
                     kv_pool_tokens: int, max_num_seqs: int, copy_bandwidth: float, matmul_flops: float) -> dict:
    """Bound for `num_requests` requests of mean `input_len` / `output_len` tokens.

    copy_bandwidth in bytes/s (read + written), matmul_flops in FLOP/s. Returns the terms and
    `output_tokens_per_s_bound`.
    """
    kv_bpt = arch.kv_bytes_per_token(dtype)
    per_request = input_len + output_len
    batch = max(1, min(max_num_seqs, int(kv_pool_tokens // per_request), num_requests))
    output_tokens = num_requests * output_len
    decode_steps = output_tokens / batch
    weight_bytes = arch.num_parameters * DTYPE_BYTES[dtype]
    # decode token t of a request reads input_len + t cached tokens; a prompt is read once and written once
    decode_kv_read = num_requests * output_len * (input_len + output_len / 2) * kv_bpt
    prefill_kv = num_requests * 2 * input_len * kv_bpt
    kv_write = num_requests * output_len * kv_bpt
    total_bytes = decode_steps * weight_bytes + decode_kv_read + prefill_kv + kv_write
    attn_per_pair = 4 * arch.num_layers * arch.num_heads * arch.head_dim
    pairs = num_requests * (input_len * input_len / 2 + output_len * (input_len + output_len / 2))
    flops = 2 * arch.num_parameters * num_requests * per_request + attn_per_pair * pairs
    memory_s, compute_s = total_bytes / copy_bandwidth, flops / matmul_flops
    bound_s = max(memory_s, compute_s)
    return {
        "batch_size": batch, "decode_steps": decode_steps, "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_bpt, "total_bytes": total_bytes, "total_flops": flops,
        "memory_time_s": memory_s, "compute_time_s": compute_s, "bound_time_s": bound_s,
        "bound": "memory" if memory_s >= compute_s else "compute",
        "output_tokens_per_s_bound": output_tokens / bound_s,
    }


def measure_device_ceilings(device: str = "cuda") -> dict:
    """Copy bandwidth (bytes read + written per second, 1 GiB buffers) and bf16 matmul rate (8192^3),
    medians of CUDA-event timings on random data."""
    import torch
    import triton.testing

    src = torch.randn(2**29, dtype=torch.bfloat16, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    mm_ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    torch.cuda.empty_cache()
    return {"copy_bandwidth_bytes_per_s": 2 * 2**30 / (copy_ms / 1e3),
            "matmul_bf16_flops_per_s": 2 * 8192**3 / (mm_ms / 1e3)}
