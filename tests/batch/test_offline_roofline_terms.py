"""offline_run.py's roofline terms: FP8 weights priced at the measured FP8 rate (and refused without one), FP8
KV bytes, and the prefill bound counting the linear layers per computed token and one LM-head row per ticket."""

from types import SimpleNamespace

import pytest

from benchmarks.roofline import linear_parameters
from case_batch_summarisation.loadtest.offline_run import fp8_terms, prefill_compute_s
from shared_engine.model_loader.model_source import resolve_model

ARCH = resolve_model("llama-3.1-8b", "dummy", None).arch


def _engine(quantization=None, kv_cache_dtype="auto"):
    return SimpleNamespace(config=SimpleNamespace(model=SimpleNamespace(quantization=quantization),
                                                  cache=SimpleNamespace(kv_cache_dtype=kv_cache_dtype)))


def test_fp8_terms_follow_the_engine_config():
    ceilings = {"matmul_bf16_flops_per_s": 6.8e14, "matmul_fp8_flops_per_s": 1.3e15}
    assert fp8_terms(_engine(), ceilings) == {}
    assert fp8_terms(_engine(kv_cache_dtype="fp8"), ceilings) == {"kv_cache_dtype": "fp8"}
    assert fp8_terms(_engine("fp8"), ceilings) == {"weight_dtype": "fp8", "fp8_matmul_flops": 1.3e15}
    with pytest.raises(ValueError, match="FP8 matmul rate"):
        fp8_terms(_engine("fp8"), {"matmul_bf16_flops_per_s": 6.8e14})


def test_prefill_bound_counts_linear_layers_per_token_and_one_lm_head_row_per_ticket():
    rate = 1e15
    one = prefill_compute_s(ARCH, 1001.0, 1000.0, 1, rate)  # one computed token after a 1,000-token prefix
    attention = 4 * ARCH.num_layers * ARCH.num_heads * ARCH.head_dim * (1000 + 0.5)
    expected = (2 * linear_parameters(ARCH) + 2 * ARCH.vocab_size * ARCH.hidden_size + attention) / rate
    assert one == pytest.approx(expected, rel=1e-12)
    bf16 = prefill_compute_s(ARCH, 1000.0, 0.0, 10, rate)
    fp8 = prefill_compute_s(ARCH, 1000.0, 0.0, 10, rate, linear_matmul_flops=2 * rate)
    linear_s = 10 * 2 * linear_parameters(ARCH) * 1000 / rate
    assert bf16 - fp8 == pytest.approx(linear_s / 2, rel=1e-9)
