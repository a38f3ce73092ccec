"""The load test's shapes in the capacity model (modelled, not measured): the engine's own scheduler in
simulated time with a recorded step profile, so the fix's scheduling rules can be compared without the
noise of a shared machine or a device call.

    python case_multilora/loadtest/sim_isolation.py --out case_multilora/the_fix/sim_isolation_cpu.json
    python case_multilora/loadtest/sim_isolation.py --profile h200 --duration-s 600 \
        --out case_multilora/the_fix/sim_isolation_h200.json

Workloads: sim_traces.py (`cpu`: the CPU load test's 6 tenants and 2 whales, open loop; `h200`:
h200_quick.py's 28 tenants and the whales' 4 concurrent requests each, closed loop). Runs, each isolated
(no whales) and with the whales: the fix (config.yaml / the_fix/config_h200.yaml), the fix before the
over-share prefill cap (`over_share_prefill_tokens` 0, core/share_cap.py), on the CPU the fix before the
long-prefill yield (the_fix/config_before_yield.yaml), and the first attempt. Step times:
shared_engine/sim/step_profiles/cpu-2core_smollm2-135m.json / h200_llama-3.1-8b.json (fixed cost plus
tokens; LoRA's own cost is not in them). TTFT here is the engine's (arrival to the first token's step end):
the served figure adds the HTTP path (gateway, API server, client; on the H200 about 14 ms, the measured
isolated median 22.3 ms at aab412d less this model's 8.2 ms), reported as `p99_ttft_vs_isolated_served`.
On the H200 the step model prices each step as the longer of host and device (`overlap_host`: the engine's
async scheduling).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
CASE_DIR = HERE.parent
REPO = CASE_DIR.parent
sys.path.insert(0, str(REPO))

from case_multilora.loadtest.sim_traces import H200Load, cpu_trace  # noqa: E402
from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.sim.calibration import for_model  # noqa: E402
from shared_engine.sim.hardware import load_hardware  # noqa: E402
from shared_engine.sim.metrics import SimMetrics  # noqa: E402
from shared_engine.sim.model_shape import resolve_arch  # noqa: E402
from shared_engine.sim.simulator import Simulator  # noqa: E402
from shared_engine.sim.workload import TraceWorkload  # noqa: E402

SERVER_KEYS = ("lora_modules", "allowed_local_lora_path")
# run name -> (config file under case_multilora/, overrides)
PROFILES = {
    "cpu": {"hardware": "cpu-2core", "overlap_host": False, "http_s": None,
            "step_profile": "shared_engine/sim/step_profiles/cpu-2core_smollm2-135m.json",
            "runs": {"the_fix": ("config.yaml", {}),
                     "before_cap": ("config.yaml", {"over_share_prefill_tokens": 0}),
                     "before_yield": ("the_fix/config_before_yield.yaml", {}),
                     "first_attempt": ("first_attempt/config.yaml", {})}},
    "h200": {"hardware": "h200", "overlap_host": True, "http_s": 0.014,
             "step_profile": "shared_engine/sim/step_profiles/h200_llama-3.1-8b.json",
             "runs": {"the_fix": ("the_fix/config_h200.yaml", {}),
                      "before_cap": ("the_fix/config_h200.yaml", {"over_share_prefill_tokens": 0}),
                      "first_attempt": ("first_attempt/config_h200.yaml", {})}},
}


class TenantMetrics(SimMetrics):
    """SimMetrics plus each finished request's tenant, arrival and first-token time (seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, float, float, float]] = []

    def on_finish(self, request) -> None:
        super().on_finish(request)
        self.rows.append((request.tenant, request.arrival_time, request.first_token_time, request.finished_time))


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def simulate(profile: str, name: str, whales: bool, duration_s: float) -> dict:
    spec = PROFILES[profile]
    path, overrides = spec["runs"][name]
    flat = {k: v for k, v in yaml.safe_load((CASE_DIR / path).read_text()).items() if k not in SERVER_KEYS}
    flat.update(overrides)
    model, arch = resolve_arch(flat.get("model"))
    hardware = for_model(load_hardware(spec["hardware"]), model, spec["hardware"])
    sim = Simulator(EngineConfig.from_flat(**flat), arch, hardware, overlap_host=spec["overlap_host"])
    metrics = TenantMetrics()
    workload = TraceWorkload(cpu_trace(duration_s, whales)) if profile == "cpu" else H200Load(duration_s, whales)
    sim.run(workload, metrics)
    wb = [(a, f) for t, a, f, _ in metrics.rows if t.startswith("t")]
    wh = [(a, f, e) for t, a, f, e in metrics.rows if t.startswith("w")]
    ttft = [f - a for a, f in wb]
    return {"config": path, "overrides": overrides, "whales": whales, "num_well_behaved": len(wb),
            "num_whale": len(wh), "well_behaved_median_ttft_ms": pct(ttft, 50),
            "well_behaved_p99_ttft_ms": pct(ttft, 99),
            "whale_median_ttft_ms": pct([f - a for a, f, _ in wh], 50),
            "whale_p99_ttft_ms": pct([f - a for a, f, _ in wh], 99),
            "whale_median_e2e_ms": pct([e - a for a, _, e in wh], 50), "num_steps": metrics.num_steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="cpu", choices=sorted(PROFILES))
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    spec = PROFILES[args.profile]
    runs = {}
    for name in spec["runs"]:
        alone, loaded = (simulate(args.profile, name, False, args.duration_s),
                         simulate(args.profile, name, True, args.duration_s))
        loaded["p99_ttft_vs_isolated"] = round(loaded["well_behaved_p99_ttft_ms"]
                                               / alone["well_behaved_p99_ttft_ms"], 2)
        if spec["http_s"]:
            http_ms = spec["http_s"] * 1000
            loaded["p99_ttft_vs_isolated_served"] = round((loaded["well_behaved_p99_ttft_ms"] + http_ms)
                                                          / (alone["well_behaved_p99_ttft_ms"] + http_ms), 2)
        runs[name] = {"isolated": alone, "with_whales": loaded}
    out = {"what": f"modelled, not measured: the engine's scheduler in simulated time, {args.profile} step profile",
           "command": "python case_multilora/loadtest/sim_isolation.py " + " ".join(argv or sys.argv[1:]),
           "step_profile": spec["step_profile"], "http_path_ms": spec["http_s"] and spec["http_s"] * 1000,
           "duration_s": args.duration_s, "runs": runs}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
