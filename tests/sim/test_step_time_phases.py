"""The `phases` step-time rule against hand-computed steps: GEMMs and attention each take the larger of their
memory and compute time, and the two add (they run one after the other)."""

from __future__ import annotations

import dataclasses

import pytest

from shared_engine.sim import load_hardware
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.step_time import StepTimeModel, item_totals


def _model(combine: str) -> StepTimeModel:
    _, arch = resolve_arch("llama-3.1-8b")
    hw = dataclasses.replace(load_hardware("h200"), combine=combine, bandwidth_fraction=1.0, matmul_fraction=1.0,
                             attention_fraction=None, step_overhead_s=0.0, per_seq_overhead_s=0.0)
    return StepTimeModel(arch, "bfloat16", hw)


def _hand(model: StepTimeModel, items) -> tuple[float, float, float, float]:
    """(weight read, GEMM compute, KV read, attention compute) seconds, from the shape's constants."""
    s, hw = model.shape, model.hardware
    _, tokens, sampled, ctx, pairs = item_totals(items)
    weights = s.weight_bytes / hw.memory_bandwidth
    gemm = (s.body_flops_per_token * tokens + s.head_flops_per_sample * sampled) / hw.matmul_flops
    kv = s.kv_bytes_per_token * (ctx + tokens) / hw.memory_bandwidth
    attn = s.attn_flops_per_pair * pairs / hw.matmul_flops
    return weights, gemm, kv, attn


def test_mixed_step_adds_compute_bound_gemms_and_memory_bound_attention():
    # 60 decodes at 5,700 tokens of context + a 452-token chunk after a 5,200-token prefix (the RAG step)
    items = [(5700, 1, 1)] * 60 + [(5200, 452, 1)]
    phases, single = _model("phases"), _model("max")
    weights, gemm, kv, attn = _hand(phases, items)
    assert gemm > weights and kv > attn  # GEMMs compute-bound, attention memory-bound
    got = phases.seconds_from_totals(*item_totals(items))
    assert got == pytest.approx(gemm + kv, rel=1e-9)
    # one roofline over the whole step lets the GEMMs hide the KV read: shorter by the smaller phase
    assert single.seconds_from_totals(*item_totals(items)) == pytest.approx(max(weights + kv, gemm + attn), rel=1e-9)
    assert got > single.seconds_from_totals(*item_totals(items))


def test_pure_decode_step_is_the_same_under_both_rules():
    items = [(1000, 1, 1)] * 64  # both phases memory-bound: weights + KV over the bandwidth either way
    weights, gemm, kv, attn = _hand(_model("phases"), items)
    assert weights > gemm and kv > attn
    for combine in ("phases", "max"):
        assert _model(combine).seconds_from_totals(*item_totals(items)) == pytest.approx(weights + kv, rel=1e-9)


def test_gpus_default_to_phases_and_the_cpu_sums():
    assert load_hardware("h200").combine == "phases" and load_hardware("l4").combine == "phases"
    assert load_hardware("cpu-2core").combine == "sum"
