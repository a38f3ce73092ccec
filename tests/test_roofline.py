"""benchmarks/roofline.py: the bf16 bound of a recorded H200 run is reproduced unchanged, and FP8 prices KV at 1
byte per element, the decoder's linear weights at 1 byte and their FLOPs at the FP8 rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.roofline import (
    FP8_MATMUL_FLOPS_H200_DATASHEET,
    linear_parameters,
    model_weight_bytes,
    offline_roofline,
)
from shared_engine.model_arch import ModelArch
from shared_engine.model_loader.model_source import PRESETS_DIR

RUN = Path(__file__).resolve().parents[1] / "benchmarks/results/offline_llama8b_1000x1000_run7.json"
ARCH = ModelArch.from_dict(json.loads((PRESETS_DIR / "llama-3.1-8b.json").read_text()))


def bound(**kw):
    recorded = json.loads(RUN.read_text())
    r = recorded["roofline"]
    args = dict(arch=ARCH, dtype="bfloat16", num_requests=1000, input_len=1000, output_len=1000,
                kv_pool_tokens=recorded["ours"]["kv_pool_tokens"], max_num_seqs=448,
                copy_bandwidth=r["copy_bandwidth_bytes_per_s"], matmul_flops=r["matmul_bf16_flops_per_s"])
    return offline_roofline(**{**args, **kw}), r


def test_bf16_bound_of_the_recorded_h200_run_is_unchanged():
    ours, recorded = bound()
    for key in ("batch_size", "weight_bytes", "kv_bytes_per_token", "total_bytes", "total_flops", "memory_time_s",
                "compute_time_s", "output_tokens_per_s_bound"):
        assert ours[key] == pytest.approx(recorded[key], rel=1e-12), key
    assert ours["kv_cache_dtype"] == ours["weight_dtype"] == "bfloat16"


def test_fp8_kv_cache_halves_kv_bytes_and_doubles_the_batch_the_pool_allows():
    bf16, _ = bound(max_num_seqs=1024, kv_pool_tokens=400_000)
    fp8, _ = bound(max_num_seqs=1024, kv_pool_tokens=800_000, kv_cache_dtype="fp8")  # same bytes, 2x tokens
    assert fp8["kv_bytes_per_token"] * 2 == bf16["kv_bytes_per_token"] == 131072
    assert fp8["batch_size"] == 2 * bf16["batch_size"] == 400
    assert fp8["weight_bytes"] == bf16["weight_bytes"] and fp8["total_flops"] == bf16["total_flops"]
    # half the decode steps (weights streamed half as often) and half the KV bytes: memory time falls by more
    # than half (the prefill/write terms halve too)
    assert fp8["memory_time_s"] < 0.5 * bf16["memory_time_s"] + 1e-9
    assert fp8["output_tokens_per_s_bound"] > bf16["output_tokens_per_s_bound"]


def test_fp8_weights_price_linear_layers_at_one_byte_and_the_fp8_rate():
    linear = linear_parameters(ARCH)
    assert linear == 32 * (4096 * 128 * (32 + 16) + 32 * 128 * 4096 + 3 * 4096 * 14336)  # 6.98e9
    rest = ARCH.num_parameters - linear  # embeddings + LM head + norms: 1.05e9
    assert model_weight_bytes(ARCH, "bfloat16", "fp8") == linear + 2 * rest
    assert model_weight_bytes(ARCH, "bfloat16") == 2 * ARCH.num_parameters == 16060522496
    bf16, r = bound()
    fp8, _ = bound(weight_dtype="fp8", fp8_matmul_flops=2 * r["matmul_bf16_flops_per_s"])
    assert fp8["weight_bytes"] == linear + 2 * rest
    assert fp8["compute_time_s"] == pytest.approx(
        bf16["compute_time_s"] - fp8["linear_flops"] / (2 * r["matmul_bf16_flops_per_s"]))
    assert fp8["total_flops"] == bf16["total_flops"] and fp8["linear_matmul_flops_per_s"] == 2 * r[
        "matmul_bf16_flops_per_s"]
    with pytest.raises(ValueError, match="fp8_matmul_flops"):
        bound(weight_dtype="fp8")


def test_batch_one_decode_bound_scales_with_the_weight_bytes():
    """At batch 1 the bound is the weight stream: FP8 weights make it about 16.06 / 9.08 = 1.77x faster."""
    kw = dict(num_requests=1, input_len=16, output_len=512, max_num_seqs=1)
    bf16, _ = bound(**kw)
    fp8, _ = bound(**kw, weight_dtype="fp8", kv_cache_dtype="fp8", fp8_matmul_flops=FP8_MATMUL_FLOPS_H200_DATASHEET)
    assert bf16["bound"] == fp8["bound"] == "memory"
    ratio = fp8["output_tokens_per_s_bound"] / bf16["output_tokens_per_s_bound"]
    assert ratio == pytest.approx(bf16["weight_bytes"] / fp8["weight_bytes"], rel=0.01) and 1.7 < ratio < 1.8
