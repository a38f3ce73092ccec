"""Fidelity of the capacity model on this CPU: predicted vs measured throughput and median TTFT.

One seeded Poisson serving workload (random token-id prompts, ignore_eos) runs twice:
- measured: the real `LLMEngine` with the default model, requests added when their arrival time comes on
  the wall clock (the offline engine driven with arrival times, as a server's engine loop would be);
- predicted: `shared_engine.sim` with the same requests, the same engine config and the `cpu-2core`
  hardware profile (calibrated from the recorded step profile in `shared_engine/sim/step_profiles/`).
The error of each figure is (predicted - measured) / measured. The H200 part needs GPU runs that do not
exist yet and is recorded as not measured.

    python scripts/sim_fidelity_cpu.py --out benchmarks/results/sim_fidelity_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402
from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.sim import Simulator, TraceWorkload, WorkloadGenerator, WorkloadSpec, load_hardware  # noqa: E402
from shared_engine.sim.model_shape import resolve_arch  # noqa: E402

ENGINE = {"max_model_len": 2048, "max_num_seqs": 64, "max_num_batched_tokens": 512}


def make_requests(args):
    spec = WorkloadSpec.from_dict({
        "name": "cpu-fidelity-poisson", "seed": args.seed, "num_requests": args.num_requests,
        "arrival": {"process": "poisson", "rate": args.rate},
        "prompt_len": {"dist": "uniform", "min": args.input_len_min, "max": args.input_len_max},
        "output_len": {"dist": "uniform", "min": args.output_len_min, "max": args.output_len_max},
    })
    _, arch = resolve_arch(None)
    gen = WorkloadGenerator(spec, arch.vocab_size, ENGINE["max_model_len"])
    return spec, gen.pop_due(float("inf"))


def predict(requests) -> dict:
    _, arch = resolve_arch(None)
    sim = Simulator(EngineConfig.from_flat(**ENGINE), arch, load_hardware("cpu-2core"))
    started = time.perf_counter()
    summary = sim.run(TraceWorkload(_copies(requests))).summary()
    return summary | {"sim_wall_s": time.perf_counter() - started}


def _copies(requests):
    from dataclasses import replace

    return [replace(r, session=None) for r in requests]


def measure(requests) -> dict:
    from shared_engine import LLM, SamplingParams

    llm = LLM(None, **ENGINE)
    engine = llm.engine
    llm.generate([[100] * 64] * 2, SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    pending = sorted(requests, key=lambda r: r.arrival_time)
    results = {}
    steps = StepLog(engine)
    t0 = time.time()
    while pending or engine.has_unfinished_requests():
        now = time.time() - t0
        while pending and pending[0].arrival_time <= now:
            r = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
            engine.add_request(r.request_id, r.prompt_token_ids, params, arrival_time=t0 + r.arrival_time)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival_time - (time.time() - t0)))
            continue
        for output in steps.step():
            if output.finished:
                results[output.request_id] = output
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in results.values()]
    finish = max(o.metrics.finished_time for o in results.values()) - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in results.values())
    return {"completed": len(results), "duration_s": finish, "total_output_tokens": out_tokens,
            "output_throughput": out_tokens / finish, "request_throughput": len(results) / finish,
            "median_ttft_ms": 1000 * statistics.median(ttft), "mean_ttft_ms": 1000 * statistics.mean(ttft),
            "num_preemptions": engine.scheduler.num_preemptions_total, "num_steps": engine.stats.num_steps,
            "step_time_predicted_over_measured": steps.ratios()}


class StepLog:
    """Times every engine step and what the step-time model predicts for the same composition, so a
    throughput or TTFT error can be split into step-time error and its amplification by queueing."""

    def __init__(self, engine) -> None:
        from shared_engine.sim.step_time import StepTimeModel

        _, arch = resolve_arch(None)
        self.model = StepTimeModel(arch, "float32", load_hardware("cpu-2core"))
        self.engine, self.pairs, self._out = engine, [], None
        original = engine.scheduler.schedule

        def schedule(*args, **kwargs):
            self._out = original(*args, **kwargs)
            return self._out

        engine.scheduler.schedule = schedule

    def step(self):
        started = time.perf_counter()
        outputs = self.engine.step()
        seconds = time.perf_counter() - started
        if self._out is not None and not self._out.is_empty:
            self.pairs.append((self.model.seconds(self._out.scheduled), seconds))
        return outputs

    def ratios(self) -> dict:
        ratios = sorted(p / m for p, m in self.pairs)
        pick = lambda q: ratios[min(len(ratios) - 1, int(q * len(ratios)))]
        return {"median": pick(0.5), "p10": pick(0.1), "p90": pick(0.9), "num_steps": len(ratios),
                "sum_predicted_over_sum_measured": sum(p for p, _ in self.pairs) / sum(m for _, m in self.pairs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--input-len-min", type=int, default=32)
    p.add_argument("--input-len-max", type=int, default=256)
    p.add_argument("--output-len-min", type=int, default=16)
    p.add_argument("--output-len-max", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--predict-only", action="store_true")
    p.add_argument("--out")
    p.add_argument("--append", action="store_true",
                   help="add this run to the existing --out file's `cpu_repeats` instead of replacing it")
    args = p.parse_args()
    spec, requests = make_requests(args)
    predicted = predict(requests)
    keys = ("output_throughput", "median_ttft_ms")
    print("predicted:", {k: round(predicted[k], 3) for k in (*keys, "utilisation", "duration_s")})
    if args.predict_only:
        return
    load_before = os.getloadavg()
    measured = measure(requests)
    load_after = os.getloadavg()
    errors = {k: 100.0 * (predicted[k] - measured[k]) / measured[k] for k in keys}
    print("measured:", {k: round(measured[k], 3) for k in keys},
          "error %:", {k: round(v, 1) for k, v in errors.items()})
    hw = load_hardware("cpu-2core")
    result = {
        "what": "capacity model fidelity: predicted (shared_engine.sim) vs measured (LLMEngine) on one workload",
        "command": "python " + " ".join(sys.argv), "environment": environment(),
        "load_average_before": load_before, "load_average_after": load_after,
        "note": "2 cores shared with other jobs: wall-clock figures move with their load",
        "model": "SmolLM2-135M-Instruct (embedded default), float32", "engine_config": ENGINE,
        "workload": {"num_requests": spec.num_requests, "arrival": "poisson", "rate": args.rate,
                     "input_len": [args.input_len_min, args.input_len_max],
                     "output_len": [args.output_len_min, args.output_len_max], "seed": args.seed},
        "hardware_profile": {"name": hw.name, "calibration": hw.calibration,
                             "calibration_error": hw.calibration_error},
        "cpu": {"predicted": {k: predicted[k] for k in (*keys, "duration_s", "utilisation", "num_preemptions",
                                                           "num_steps", "sim_wall_s")},
                "measured": measured, "error_pct": errors,
                "within_15pct": {k: abs(v) <= 15.0 for k, v in errors.items()}},
        "h200": "see benchmarks/results/sim_fidelity_h200.json (scripts/sim_fidelity_gpu.py)",
    }
    if args.out and args.append and Path(args.out).exists():
        existing = json.loads(Path(args.out).read_text())
        repeat = {k: result[k] for k in ("command", "load_average_before", "load_average_after", "workload", "cpu")}
        existing.setdefault("cpu_repeats", []).append(repeat | {"commit": result["environment"]["commit"]})
        result = existing
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
