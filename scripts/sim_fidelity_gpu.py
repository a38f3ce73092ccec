"""Fidelity of the capacity model on the H200: predicted vs measured offline throughput and median TTFT.

Inputs, all recorded on one NVIDIA H200 with dummy weights (scripts/gpu_fidelity_runs.sh):
- the step profiles `shared_engine/sim/step_profiles/h200_<model>.json` (scripts/profile_steps.py), which
  calibrate the H200 hardware profile per model (`calibration.calibrated`);
- the measured offline runs of the GPU issue (scripts/bench_offline.py results): llama-3.1-8b, 1,000 requests
  of 1,000 in / 1,000 out; qwen3-0.6b, nano-vllm's 256 requests with lengths uniform in [100, 1024].
The simulator replays the same requests (bench_offline's own generator and seed, all arriving at t=0) under
the measured run's engine config. Error = (predicted - measured) / measured, reported either way. Runs with
async scheduling are also predicted with `overlap_host` (the simulator's other bound, see Simulator).

    python scripts/sim_fidelity_gpu.py --out benchmarks/results/sim_fidelity_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_offline import workload  # noqa: E402

from benchmarks.env_info import environment  # noqa: E402
from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.sim import Simulator, TraceWorkload, load_hardware  # noqa: E402
from shared_engine.sim.calibration import calibrated  # noqa: E402
from shared_engine.sim.model_shape import resolve_arch  # noqa: E402
from shared_engine.sim.workload import RequestSpec  # noqa: E402

LLAMA_PROFILE = "shared_engine/sim/step_profiles/h200_llama-3.1-8b.json"
QWEN_PROFILE = "shared_engine/sim/step_profiles/h200_qwen3-0.6b.json"
# Each run is simulated under its own engine config, async scheduling included (absent from runs older than
# the flag: those ran the synchronous step).
RUNS = {
    "llama-3.1-8b_1000x1000": ("benchmarks/results/offline_llama8b_1000x1000_run7.json", LLAMA_PROFILE),
    "qwen3-0.6b_nanovllm": ("benchmarks/results/offline_qwen3_0.6b_nanovllm_run4.json", QWEN_PROFILE),
    "llama-3.1-8b_1000x1000_synchronous": ("benchmarks/results/offline_llama8b_1000x1000_run5.json", LLAMA_PROFILE),
    "qwen3-0.6b_nanovllm_synchronous": ("benchmarks/results/offline_qwen3_0.6b_nanovllm_run3.json", QWEN_PROFILE),
}
# A serving run (closed-loop users, shared system prompt, chunked prefill mixed with decodes): the RAG case's
# fix at the brief's scale on one H200, against the same llama-3.1-8b step profile.
SERVING_RUNS = {
    "rag_the_fix_1replica": ("benchmarks/results/rag_case_h200_the_fix_695e9b6_1replica.json", LLAMA_PROFILE),
    "rag_the_fix_1replica_synchronous": ("benchmarks/results/rag_case_h200_the_fix_5de82f5_async_cascade.json",
                                         LLAMA_PROFILE),
}
# The fix's user sweep on two H200s (one replica per GPU, users routed at random): one serving check per load.
SWEEP_RUNS = {"rag_the_fix_2replicas": ("case_rag_chatbot/the_fix/sweep_h200.json", LLAMA_PROFILE)}
SERVING_KEYS = ("request_throughput", "median_ttft_ms", "p95_ttft_ms", "median_itl_ms", "p95_itl_ms")
ENGINE_KEYS = ("max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
               "enable_prefix_caching", "gpu_memory_utilization")


def _async_scheduling(engine_config: dict) -> bool:
    return bool(engine_config.get("async_scheduling"))


def predict(measured: dict, profile_path: Path, overlap_host: bool = False) -> dict:
    w = measured["workload"]
    prompts, out_lens = workload(SimpleNamespace(**w))
    requests = [RequestSpec(f"r{i}", 0.0, p, n) for i, (p, n) in enumerate(zip(prompts, out_lens))]
    model = measured["ours"]["model"]
    _, arch = resolve_arch(model)
    engine_config = measured["ours"]["engine_config"]
    config = EngineConfig.from_flat(model=model, **{k: engine_config[k] for k in ENGINE_KEYS},
                                    async_scheduling=_async_scheduling(engine_config))
    hardware = calibrated(load_hardware("h200"), profile_path)
    started = time.perf_counter()
    summary = Simulator(config, arch, hardware, overlap_host=overlap_host).run(TraceWorkload(requests)).summary()
    return {"output_throughput": summary["output_throughput"], "median_ttft_ms": summary["median_ttft_ms"],
            "duration_s": summary["duration_s"], "num_preemptions": summary["num_preemptions"],
            "sim_wall_s": time.perf_counter() - started,
            "calibration": {"profile": str(profile_path.relative_to(ROOT)), **hardware.calibration_error,
                            "bandwidth_fraction": hardware.bandwidth_fraction,
                            "matmul_fraction": hardware.matmul_fraction,
                            "step_overhead_s": hardware.step_overhead_s,
                            "per_seq_overhead_s": hardware.per_seq_overhead_s,
                            "device_step_overhead_s": hardware.device_step_overhead_s,
                            "device_per_seq_overhead_s": hardware.device_per_seq_overhead_s}}


def predict_serving(measured: dict, profile_path: Path, overlap_host: bool = False) -> dict:
    """The case's closed-loop workload (case_rag_chatbot/cost_model.py's `workload_spec`, as many requests as
    the measured window completed) under the measured run's engine config."""
    sys.path.insert(0, str(ROOT / "case_rag_chatbot"))
    from cost_model import load_case, workload_spec

    profile, _ = load_case()
    engine_config = measured["engine_config"]
    config = EngineConfig.from_flat(model=engine_config["model"], **{k: engine_config[k] for k in (
        *ENGINE_KEYS, "num_gpu_blocks_override", "max_num_seqs")}, async_scheduling=_async_scheduling(engine_config))
    _, arch = resolve_arch(engine_config["model"])
    hardware = calibrated(load_hardware("h200"), profile_path)
    spec = workload_spec(profile, measured["workload"]["users"], measured["summary"]["completed"])
    started = time.perf_counter()
    summary = Simulator(config, arch, hardware, overlap_host=overlap_host).run_replicas(
        spec, measured.get("replicas", 1)).summary()
    return {**{k: summary[k] for k in SERVING_KEYS}, "sim_wall_s": time.perf_counter() - started,
            "calibration": {"profile": str(profile_path.relative_to(ROOT)), **hardware.calibration_error}}


def _overlap_bound(name: str, entry: dict, predict_fn, measured: dict, profile_path: Path, actual: dict,
                   keys) -> None:
    """For a run with async scheduling, add the prediction under the simulator's other bound (`overlap_host`:
    the host's work hidden under the device's) to `entry`, and print it."""
    overlapped = predict_fn(measured, ROOT / profile_path, overlap_host=True)
    over = {k: 100.0 * (overlapped[k] - actual[k]) / actual[k] for k in keys}
    entry |= {"predicted_overlap_host": overlapped, "error_pct_overlap_host": over}
    print(f"{name} (overlap_host)", {k: (round(actual[k], 1), round(overlapped[k], 1), f"{over[k]:+.1f}%")
                                     for k in keys}, flush=True)


def serving_runs():
    """(name, results file, step profile, measured run) for every serving check: the single runs of
    SERVING_RUNS and each load of the sweeps in SWEEP_RUNS (as a run of its own)."""
    for name, (measured_path, profile_path) in SERVING_RUNS.items():
        yield name, measured_path, profile_path, json.loads((ROOT / measured_path).read_text())
    for name, (measured_path, profile_path) in SWEEP_RUNS.items():
        sweep = json.loads((ROOT / measured_path).read_text())
        for run in sweep["runs"]:
            users = run["load"]["users"]
            measured = {"engine_config": run["engine_config"], "workload": {"users": users},
                        "summary": run["summary"], "commit": sweep["commit"], "replicas": sweep["replicas"]}
            yield f"{name}_{users}users", measured_path, profile_path, measured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    args = p.parse_args()
    keys = ("output_throughput", "median_ttft_ms")
    result = {"what": "capacity model fidelity on the H200: predicted (shared_engine.sim, calibrated on the "
                      "H200 step profile) vs measured (scripts/bench_offline.py on the H200)",
              "command": "python " + " ".join(sys.argv), "environment": environment(), "workloads": {}}
    for name, (measured_path, profile_path) in RUNS.items():
        measured = json.loads((ROOT / measured_path).read_text())
        predicted = predict(measured, ROOT / profile_path)
        ours = measured["ours"]
        errors = {k: 100.0 * (predicted[k] - ours[k]) / ours[k] for k in keys}
        result["workloads"][name] = {
            "measured": {"file": measured_path, "commit": measured["commit"], "gpu": measured["hardware"]["gpu"],
                         "async_scheduling": _async_scheduling(ours["engine_config"]),
                         **{k: ours[k] for k in keys}, "elapsed_s": ours["elapsed_s"]},
            "predicted": predicted, "error_pct": errors,
            "within_15pct": {k: abs(v) <= 15.0 for k, v in errors.items()}}
        print(name, {k: (round(ours[k], 1), round(predicted[k], 1), f"{errors[k]:+.1f}%") for k in keys}, flush=True)
        if _async_scheduling(ours["engine_config"]):
            _overlap_bound(name, result["workloads"][name], predict, measured, profile_path, ours, keys)
    result["serving"] = {}
    for name, measured_path, profile_path, measured in serving_runs():
        predicted = predict_serving(measured, ROOT / profile_path)
        m = measured["summary"]
        errors = {k: 100.0 * (predicted[k] - m[k]) / m[k] for k in SERVING_KEYS}
        result["serving"][name] = {
            "what": f"RAG case, the fix, {measured['workload']['users']} closed-loop users (15 s think time) on "
                    f"{measured.get('replicas', 1)} H200(s), one replica each: a serving check beyond the issue's "
                    "two offline workloads",
            "measured": {"file": measured_path, "commit": measured["commit"], "replicas": measured.get("replicas", 1),
                         "users": measured["workload"]["users"],
                         "async_scheduling": _async_scheduling(measured["engine_config"]),
                         **{k: m[k] for k in SERVING_KEYS}},
            "predicted": predicted, "error_pct": errors}
        print(name, {k: (round(m[k], 1), round(predicted[k], 1), f"{errors[k]:+.1f}%") for k in SERVING_KEYS})
        if _async_scheduling(measured["engine_config"]):
            _overlap_bound(name, result["serving"][name], predict_serving, measured, profile_path, m, SERVING_KEYS)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
