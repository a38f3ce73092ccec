"""The GPU (`max`) fit must be set by every kind of step in a profile, not by the kind that is most of it.

A profile like the H200 qwen3-0.6b one: most steps are compute-bound prefill chunks (bandwidth does not
change their time), the rest memory-bound decode batches. A fit that minimised the median error could fit
the prefill majority alone and leave the bandwidth fraction anywhere; the mean error cannot.
"""

from __future__ import annotations

import numpy as np
import pytest

from shared_engine.sim.calibration import fit_steps, profile_features

CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 8192, "tie_word_embeddings": True}
PEAK_BW, PEAK_MM = 1e10, 2e12  # 200 FLOP per byte, as an H200 (989 TFLOP/s over 4.8 TB/s)
TRUTH = {"fb": 0.7, "ff": 0.3, "a": 0.002, "b": 1e-5}


def mixed_profile(num_prefill: int, num_decode: int) -> dict:
    """`num_prefill` 4k-token prefill steps and `num_decode` decode batches (1-256 requests at 100-2000
    tokens), timed exactly by the roofline with TRUTH's fractions and overheads (1% noise)."""
    rng = np.random.default_rng(1)
    steps = [{"items": [[0, 4096, 1]], "seconds": 1.0} for _ in range(num_prefill)]
    for _ in range(num_decode):
        batch, ctx = int(rng.integers(1, 257)), int(rng.integers(100, 2000))
        steps.append({"items": [[ctx, 1, 1]] * batch, "seconds": 1.0})
    profile = {"model_config": CONFIG, "dtype": "bfloat16", "steps": steps}
    (seqs, moved, mm, att), _ = profile_features(profile)
    body = np.maximum(moved / (PEAK_BW * TRUTH["fb"]), (mm + att) / (PEAK_MM * TRUTH["ff"]))
    seconds = (TRUTH["a"] + TRUTH["b"] * seqs + body) * rng.normal(1.0, 0.01, len(steps))
    for step, t in zip(steps, seconds):
        step["seconds"] = float(t)
    return profile


def test_prefill_steps_are_compute_bound_and_decodes_memory_bound():
    (seqs, moved, mm, att), _ = profile_features(mixed_profile(1, 1))
    mem, compute = moved / (PEAK_BW * TRUTH["fb"]), (mm + att) / (PEAK_MM * TRUTH["ff"])
    assert compute[0] > 5 * mem[0]  # the prefill: bandwidth does not change its time
    assert mem[1] > 5 * compute[1]  # the decode batch


@pytest.mark.parametrize("share_prefill", [0.3, 0.6, 0.8])
def test_bandwidth_is_fitted_from_the_decode_minority(share_prefill):
    num_prefill = int(200 * share_prefill)
    profile = mixed_profile(num_prefill, 200 - num_prefill)
    fit = fit_steps(*profile_features(profile), PEAK_BW, PEAK_MM, "max")
    assert fit.bandwidth_fraction == pytest.approx(TRUTH["fb"], rel=0.05)
    assert fit.matmul_fraction == pytest.approx(TRUTH["ff"], rel=0.05)
    assert fit.num_outliers < 20  # 3 MADs of 1% Gaussian noise is 2 sigma: about 5% dropped
    assert fit.median_rel_error < 0.02


def test_fractions_between_coarse_grid_points_are_recovered():
    # 0.7 and 0.3 lie between the 12%-apart coarse grid points; the refined search lands within 2%.
    fit = fit_steps(*profile_features(mixed_profile(100, 100)), PEAK_BW, PEAK_MM, "max")
    assert abs(fit.bandwidth_fraction / TRUTH["fb"] - 1) < 0.02
    assert abs(fit.matmul_fraction / TRUTH["ff"] - 1) < 0.02
