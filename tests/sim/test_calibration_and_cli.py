"""Calibration recovers known fractions from a synthetic profile; the CLI runs end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shared_engine.sim.__main__ import main
from shared_engine.sim.calibration import fit_steps, profile_features

CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 4096, "tie_word_embeddings": True}


def synthetic_profile(truth: dict, combine: str) -> dict:
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(150):
        batch = int(rng.integers(1, 32))
        items = [[int(rng.integers(0, 1000)), 1, 1] for _ in range(batch)]
        if rng.random() < 0.4:
            items.append([0, int(rng.integers(16, 1024)), 1])
        steps.append({"items": items, "seconds": 1.0})
    profile = {"model_config": CONFIG, "dtype": "float32", "steps": steps}
    features, _ = profile_features(profile)
    seqs, moved, mm, att = features
    mem = moved / (1e10 * truth["fb"])
    compute = mm / (1e11 * truth["ff"]) + att / (1e11 * truth["fa"])
    body = mem + compute if combine == "sum" else np.maximum(mem, compute)
    seconds = truth["a"] + truth["b"] * seqs + body
    for step, t in zip(steps, seconds):
        step["seconds"] = float(t * rng.normal(1.0, 0.01))
    return profile


def test_sum_fit_recovers_rates():
    truth = {"fb": 0.5, "ff": 0.7, "fa": 0.1, "a": 0.0, "b": 2e-4}
    profile = synthetic_profile(truth, "sum")
    fit = fit_steps(*profile_features(profile), 1e10, 1e11, "sum")
    assert fit.bandwidth_fraction == pytest.approx(0.5, rel=0.05)
    assert fit.matmul_fraction == pytest.approx(0.7, rel=0.1)
    assert fit.attention_fraction == pytest.approx(0.1, rel=0.2)
    assert fit.median_rel_error < 0.02


def test_max_fit_predicts_well():
    truth = {"fb": 0.8, "ff": 0.6, "fa": 0.6, "a": 0.002, "b": 1e-5}
    profile = synthetic_profile(truth, "max")
    fit = fit_steps(*profile_features(profile), 1e10, 1e11, "max")
    assert fit.median_rel_error < 0.05


@pytest.mark.parametrize("gpu", ["H200", "cpu-2core"])
def test_cli_end_to_end(tmp_path, capsys, gpu):
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "name: tiny\nnum_requests: 60\narrival: {process: poisson, rate: 4}\n"
        "prompt_len: {dist: uniform, min: 20, max: 200}\noutput_len: {dist: uniform, min: 5, max: 30}\n"
        "prefix: {system_prompt_len: 64}\nslo: {p99_ttft_ms: 100000}\n"
        "prices: {api_input_usd_per_1m: 0.15, api_output_usd_per_1m: 0.6, date: 2024-07, source: test}\n")
    config = tmp_path / "engine.yaml"
    config.write_text("model: smollm2-135m\nmax_model_len: 1024\nmax-num-seqs: 16\n")
    out = tmp_path / "report.json"
    assert main(["--config", str(config), "--workload", str(workload), "--gpu", gpu, "--replicas", "2",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Median TTFT (ms)" in text and "traffic 10x" in text
    report = json.loads(out.read_text())
    assert report["baseline"]["summary"]["completed"] == 60
    assert report["baseline"]["summary"]["prefix_cache_hits"] > 0
    assert report["baseline"]["fewest_replicas_for_slo"]["replicas"] == 1
    assert report["traffic_10x"]["summary"]["completed"] == 60


def test_png_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    from shared_engine.sim.report import write_png

    summary = {f"{s}_{k}_ms": 1.0 for s in ("median", "p90", "p99") for k in ("ttft", "tpot", "itl", "e2el")}
    report = {"inputs": {"model": "m", "hardware": {"name": "H200"}}, "baseline": {"summary": summary}}
    assert write_png(report, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
