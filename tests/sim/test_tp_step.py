"""The capacity model's tensor-parallel step (sim/step_time.py, sim/tp_comm.py): per-rank shares of the
weights, KV and FLOPs; the collectives' term (2 all-reduces per layer + the embedding's, the logits'
all-gather) with the ring traffic; `fit` recovering latency and bandwidth from measured steps; the
simulator's KV pool per GPU at TP=2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shared_engine.config import EngineConfig
from shared_engine.model_arch import ModelArch
from shared_engine.model_loader.model_source import PRESETS_DIR
from shared_engine.sim.hardware import load_hardware
from shared_engine.sim.simulator import Simulator
from shared_engine.sim.step_time import StepShape, StepTimeModel
from shared_engine.sim.tp_comm import TPCommModel, fit

ARCH_70B = ModelArch.from_dict(json.loads((PRESETS_DIR / "llama-3.1-70b.json").read_text()))
ARCH_8B = ModelArch.from_dict(json.loads((PRESETS_DIR / "llama-3.1-8b.json").read_text()))


def test_70b_preset_has_llama_3_1_70b_shapes():
    assert ARCH_70B.num_parameters == pytest.approx(70.55e9, rel=0.005)  # Meta's model card: 70.6B
    assert (ARCH_70B.num_heads, ARCH_70B.num_kv_heads, ARCH_70B.num_layers) == (64, 8, 80)


def test_rank_shares_halve_the_weights_kv_and_flops():
    one, two = StepShape.from_arch(ARCH_70B, "bfloat16"), StepShape.from_arch(ARCH_70B, "bfloat16", 2)
    embed = ARCH_70B.vocab_size * ARCH_70B.hidden_size * 2
    norms = (2 * ARCH_70B.num_layers + 1) * ARCH_70B.hidden_size * 2  # RMSNorm weights: on every rank
    assert two.weight_bytes == (one.weight_bytes - norms) / 2 + norms
    assert two.kv_bytes_per_token == one.kv_bytes_per_token / 2
    assert two.body_flops_per_token == pytest.approx(one.body_flops_per_token / 2, rel=1e-4)
    assert two.attn_flops_per_pair == one.attn_flops_per_pair / 2
    assert one.weight_bytes / 2 + embed / 2 < 80e9  # half of 70B in bf16 (plus its embedding shard) fits a GPU


def test_comm_term_counts_every_collective():
    comm = TPCommModel.for_model(ARCH_70B, "bfloat16", 2, latency_s=1e-5, bus_bandwidth=4e11)
    assert comm.num_allreduces == 161
    count, bus = comm.terms(num_tokens=1, num_sampled=1)
    assert count == 162  # 161 all-reduces + the logits' all-gather
    assert bus == pytest.approx(2 * 0.5 * 161 * 8192 * 2 + 0.5 * 128256 * 2)
    assert comm.seconds(1, 1) == pytest.approx(162e-5 + bus / 4e11)
    assert TPCommModel.for_model(ARCH_70B, "bfloat16", 1, 1e-5, 4e11).seconds(100, 1) == 0.0


def test_tp_step_adds_the_comm_term_to_the_halved_roofline():
    h200 = load_hardware("h200")
    tp1 = StepTimeModel(ARCH_8B, "bfloat16", h200)
    tp2 = StepTimeModel(ARCH_8B, "bfloat16", h200, tensor_parallel_size=2)
    decode1, decode2 = tp1.decode_floor_seconds(1, 1000), tp2.decode_floor_seconds(1, 1000)
    no_comm = dataclasses.replace(tp2.comm, latency_s=0.0, bus_bandwidth=float("inf"))
    assert tp2.comm.seconds(1, 1) > 0 and decode2 - tp2.comm.seconds(1, 1) < decode1
    tp2.comm = no_comm
    bare = tp2.decode_floor_seconds(1, 1000)
    overhead = (h200.step_overhead_s + h200.per_seq_overhead_s + h200.device_step_overhead_s
                + h200.device_per_seq_overhead_s)
    assert bare - overhead == pytest.approx((decode1 - overhead) / 2, rel=0.02)  # weight streaming halves


def test_no_tp_without_allreduce_figures():
    bare = dataclasses.replace(load_hardware("h200"), allreduce_latency_s=None)
    with pytest.raises(ValueError, match="allreduce"):
        StepTimeModel(ARCH_8B, "bfloat16", bare, tensor_parallel_size=2)


def test_fit_recovers_latency_and_bandwidth():
    comm = TPCommModel.for_model(ARCH_8B, "bfloat16", 2, latency_s=0.0, bus_bandwidth=1.0)
    true_latency, true_bw = 12e-6, 3.1e11
    steps = [(n, s, comm.terms(n, s)[0] * true_latency + comm.terms(n, s)[1] / true_bw)
             for n, s in [(1, 1), (8, 8), (64, 64), (512, 1), (2048, 4)]]
    latency, bw = fit(comm, steps)
    assert latency == pytest.approx(true_latency, rel=1e-6) and bw == pytest.approx(true_bw, rel=1e-6)
    with pytest.raises(ValueError, match="same shape"):
        fit(comm, [(1, 1, 1e-3), (1, 1, 1.1e-3)])


def test_simulator_sizes_the_kv_pool_per_gpu_at_tp2():
    config = {"max_model_len": 4096, "max_num_batched_tokens": 2048}
    h200 = load_hardware("h200")
    with pytest.raises(ValueError, match="do not fit"):
        Simulator(EngineConfig.from_flat(**config), ARCH_70B, h200)  # 141 GB of weights on one H200
    two = Simulator(EngineConfig.from_flat(tensor_parallel_size=2, **config), ARCH_70B, h200)
    per_block = 2 * 80 * 4 * 128 * 2 * 16  # K and V, 80 layers, 4 of 8 KV heads per rank, bf16, 16 tokens
    free = h200.memory_bytes * 0.9 - 70.55e9 * 2 / 2
    assert two.num_blocks == pytest.approx(free / per_block, rel=0.02)


def test_tp_calibrate_script_recovers_a_synthetic_profile(tmp_path):
    """scripts/tp_calibrate.py on a step profile whose device spans are the compute-only model plus known
    collectives (12 us, 300 GB/s): the fit returns them."""
    import subprocess
    import sys

    from shared_engine.sim.calibration import for_model
    from shared_engine.sim.step_time import item_totals

    hw = dataclasses.replace(for_model(load_hardware("h200"), "llama-3.1-8b"), allreduce_latency_s=0.0,
                             allreduce_bandwidth=float("inf"), step_overhead_s=0.0, per_seq_overhead_s=0.0)
    model = StepTimeModel(ARCH_8B, "bfloat16", hw, tensor_parallel_size=2)
    truth = dataclasses.replace(model.comm, latency_s=12e-6, bus_bandwidth=3e11)
    shapes = [[(100, 1, True)], [(500, 1, True)] * 64, [(0, 2048, True)], [(40, 1, True)] * 8 + [(0, 1000, True)]]
    steps = [{"items": items, "gpu_seconds": model.seconds_from_totals(*item_totals(items))
              + truth.seconds(*item_totals(items)[1:3]), "seconds": 0.0} for items in shapes]
    profile = {"model": "llama-3.1-8b", "model_config": json.loads((PRESETS_DIR / "llama-3.1-8b.json").read_text()),
               "dtype": "bfloat16", "engine_config": {"tensor_parallel_size": 2}, "steps": steps}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    subprocess.run([sys.executable, "scripts/tp_calibrate.py", "--profile", str(tmp_path / "p.json"),
                    "--out", str(tmp_path / "fit.json")], check=True, capture_output=True)
    fitted = json.loads((tmp_path / "fit.json").read_text())
    assert fitted["allreduce_latency_s"] == pytest.approx(12e-6, rel=1e-6)
    assert fitted["allreduce_bandwidth"] == pytest.approx(3e11, rel=1e-6)
