"""A step profile that records each step's GPU span is fitted twice: the device (fractions and device
overheads) on the spans, the host (overheads) on the rest. Async scheduling then prices a step as the longer
of the two, the synchronous step as their sum."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from shared_engine.sim import load_hardware
from shared_engine.sim.calibration import calibrated, fit_host, profile_features
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.step_time import StepTimeModel

CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 8192, "tie_word_embeddings": True}
PEAK_BW, PEAK_MM = 1e10, 2e12
TRUTH = {"fb": 0.7, "ff": 0.3, "dev_a": 5e-4, "dev_b": 2e-6, "host_a": 3e-4, "host_b": 1.5e-5}


def _hardware(**overrides):
    base = dataclasses.replace(load_hardware("h200"), memory_bandwidth=PEAK_BW, matmul_flops=PEAK_MM, combine="max")
    return dataclasses.replace(base, **overrides)


def profile_with_spans(with_spans: bool = True) -> dict:
    """Decode batches (1-256 requests) and prefills, device time from TRUTH's roofline and device overheads,
    host time TRUTH's host overheads (2% noise on each); wall = host + device (synchronous steps)."""
    rng = np.random.default_rng(3)
    steps = [{"items": [[0, int(n), 1]], "seconds": 1.0} for n in rng.integers(256, 4096, 40)]
    for _ in range(160):
        batch, ctx = int(rng.integers(1, 257)), int(rng.integers(100, 2000))
        steps.append({"items": [[ctx, 1, 1]] * batch, "seconds": 1.0})
    profile = {"model": "toy", "model_config": CONFIG, "dtype": "bfloat16", "steps": steps,
               "ceilings": {"copy_bytes_per_s": PEAK_BW, "matmul_flops_per_s": PEAK_MM}}
    (seqs, moved, mm, att), _ = profile_features(profile)
    body = np.maximum(moved / (PEAK_BW * TRUTH["fb"]), (mm + att) / (PEAK_MM * TRUTH["ff"]))
    device = (TRUTH["dev_a"] + TRUTH["dev_b"] * seqs + body) * rng.normal(1.0, 0.02, len(steps))
    host = (TRUTH["host_a"] + TRUTH["host_b"] * seqs) * rng.normal(1.0, 0.02, len(steps))
    for step, d, h in zip(steps, device, host):
        step["seconds"] = float(d + h)
        if with_spans:
            step["gpu_seconds"] = float(d)
    return profile


def _calibrate(tmp_path, profile: dict, name: str):
    path = tmp_path / name
    path.write_text(json.dumps(profile))
    return calibrated(_hardware(), path)


def test_host_and_device_overheads_are_recovered_apart(tmp_path):
    hw = _calibrate(tmp_path, profile_with_spans(), "spans.json")
    assert hw.bandwidth_fraction == pytest.approx(TRUTH["fb"], rel=0.05)
    assert hw.matmul_fraction == pytest.approx(TRUTH["ff"], rel=0.05)
    assert hw.step_overhead_s == pytest.approx(TRUTH["host_a"], rel=0.1)
    assert hw.per_seq_overhead_s == pytest.approx(TRUTH["host_b"], rel=0.05)
    assert hw.device_per_seq_overhead_s == pytest.approx(TRUTH["dev_b"], rel=0.3)
    assert hw.device_step_overhead_s == pytest.approx(TRUTH["dev_a"], rel=0.3)
    err = hw.calibration_error
    assert err["median_rel_error"] < 0.03 and err["host_median_rel_error"] < 0.03
    assert "GPU span" in hw.overhead_source


def test_without_spans_the_host_absorbs_the_device_overheads(tmp_path):
    hw = _calibrate(tmp_path, profile_with_spans(with_spans=False), "no_spans.json")
    assert hw.device_step_overhead_s == 0.0 and hw.device_per_seq_overhead_s == 0.0
    # The whole step's fixed and per-request costs land in the host's overheads.
    assert hw.per_seq_overhead_s == pytest.approx(TRUTH["host_b"] + TRUTH["dev_b"], rel=0.2)


def test_async_step_is_the_longer_of_host_and_device_and_sync_their_sum():
    _, arch = resolve_arch("llama-3.1-8b")
    hw = dataclasses.replace(load_hardware("h200"), step_overhead_s=1e-3, per_seq_overhead_s=1e-5,
                             device_step_overhead_s=2e-3, device_per_seq_overhead_s=3e-6)
    sync, overlapped = StepTimeModel(arch, "bfloat16", hw), StepTimeModel(arch, "bfloat16", hw, overlap_host=True)
    bare = StepTimeModel(arch, "bfloat16", dataclasses.replace(
        hw, step_overhead_s=0.0, per_seq_overhead_s=0.0, device_step_overhead_s=0.0, device_per_seq_overhead_s=0.0))
    for batch in (1, 64, 400):
        body = bare.decode_floor_seconds(batch, 1000)
        host, device = 1e-3 + 1e-5 * batch, 2e-3 + 3e-6 * batch + body
        assert sync.decode_floor_seconds(batch, 1000) == pytest.approx(host + device, rel=1e-9)
        assert overlapped.decode_floor_seconds(batch, 1000) == pytest.approx(max(host, device), rel=1e-9)
    # A host slower than the device sets the async step's time.
    slow_host = StepTimeModel(arch, "bfloat16", dataclasses.replace(hw, per_seq_overhead_s=1e-3), overlap_host=True)
    assert slow_host.decode_floor_seconds(400, 1000) == pytest.approx(1e-3 + 1e-3 * 400, rel=1e-9)


def test_host_fit_drops_outliers():
    seqs = np.arange(1, 201, dtype=float)
    host = (3e-4 + 1.5e-5 * seqs) * np.random.default_rng(0).normal(1.0, 0.02, len(seqs))
    host[::25] *= 5  # a busy machine's slow steps
    fit = fit_host(seqs, host)
    assert 8 <= fit.num_outliers <= 20  # the 8 slow steps, and a few of the noise's tail
    assert fit.step_overhead_s == pytest.approx(3e-4, rel=0.1)
    assert fit.per_seq_overhead_s == pytest.approx(1.5e-5, rel=0.03)
    assert fit.median_rel_error < 0.03


def test_the_cli_calibrates_on_the_models_recorded_step_profile():
    from shared_engine.sim.calibration import for_model

    h200 = load_hardware("H200")
    llama = for_model(h200, "llama-3.1-8b")  # step_profiles/h200_llama-3.1-8b.json, recorded with GPU spans
    assert "h200_llama-3.1-8b.json" in llama.fraction_source and "GPU span" in llama.overhead_source
    assert llama.device_step_overhead_s > 0 and llama.step_overhead_s != h200.step_overhead_s
    assert for_model(h200, "smollm2-135m") is h200  # no recorded profile: the datasheet profile as it is
    cpu = load_hardware("cpu-2core")  # already calibrated by its own file
    assert for_model(cpu, "smollm2-135m") is cpu


def test_hardware_keys_resolve_display_names():
    from shared_engine.sim.hardware import hardware_key

    assert hardware_key("H200") == "h200" and hardware_key("A100 80GB SXM") == "a100-80gb"
    assert hardware_key("h100_sxm") == "h100-sxm"
    with pytest.raises(ValueError, match="unknown hardware"):
        hardware_key("B200")


def test_cli_names_the_step_profile_it_calibrated_on(tmp_path, capsys):
    from shared_engine.sim.__main__ import main

    workload = tmp_path / "w.yaml"
    workload.write_text("name: tiny\nnum_requests: 20\narrival: {process: poisson, rate: 50}\n"
                        "prompt_len: {dist: uniform, min: 20, max: 200}\n"
                        "output_len: {dist: uniform, min: 5, max: 30}\n")
    config = tmp_path / "engine.yaml"
    out = tmp_path / "report.json"
    for model, calibrated_on in (("qwen3-0.6b", "h200_qwen3-0.6b.json"), ("smollm2-135m", None)):
        config.write_text(f"model: {model}\nmax_model_len: 1024\n")
        assert main(["--config", str(config), "--workload", str(workload), "--gpu", "H200", "--json", str(out),
                     "--traffic-multiplier", "0"]) == 0
        header = capsys.readouterr().out.splitlines()[1]
        hardware = json.loads(out.read_text())["inputs"]["hardware"]
        if calibrated_on:
            assert calibrated_on in header and calibrated_on in hardware["fraction_source"]
            assert hardware["device_step_overhead_s"] > 0
        else:  # no recorded profile for this model: the datasheet profile and its stated overheads
            assert "h200_" not in header and hardware["device_step_overhead_s"] == 0.0
