"""What the kernel benchmarks share: device and dtype, timing (triton.testing.do_bench medians, microseconds),
relative error, the measured ceilings, and paged K/V set-ups with their contiguous equivalents."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEV, BF16 = "cuda", torch.bfloat16
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def bench_us(fn, rep_ms: int = 100) -> float:
    return do_bench(fn, warmup=max(10, rep_ms // 4), rep=rep_ms, return_mode="median") * 1e3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def measure_ceilings() -> dict:
    src = torch.randn(2**30, device=DEV, dtype=BF16)  # 2 GiB
    dst = torch.empty_like(src)
    t = bench_us(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() * 2 / t / 1e3
    a = torch.randn(8192, 8192, device=DEV, dtype=BF16)
    b = torch.randn(8192, 8192, device=DEV, dtype=BF16)
    t_mm = bench_us(lambda: a @ b)
    return {"copy_GBps": copy_gbs, "bf16_matmul_TFLOPs": 2 * 8192**3 / t_mm / 1e6}


def paged_setup(batch, ctx, hk, d, bs, gen):
    nblk = batch * ctx // bs
    k_cache = torch.randn(nblk, bs, hk, d, device=DEV, dtype=BF16)
    v_cache = torch.randn(nblk, bs, hk, d, device=DEV, dtype=BF16)
    bt = torch.randperm(nblk, device=DEV, generator=gen).view(batch, ctx // bs).int()
    return k_cache, v_cache, bt


def contiguous_kv(cache, bt):  # [batch, num_kv_heads, ctx, head_dim]
    b, nb = bt.shape
    return (
        cache[bt.long()]
        .reshape(b, nb * cache.shape[1], cache.shape[2], cache.shape[3])
        .transpose(1, 2)
        .contiguous()
    )
