"""The CPU load test's shape in the capacity model (modelled, not measured): the engine's own scheduler in
simulated time with this CPU's recorded step profile, so the fix's scheduling rules can be compared without
the shared machine's noise.

    python case_multilora/loadtest/sim_isolation.py --out case_multilora/the_fix/sim_isolation_cpu.json

Workload (seeded, open loop, `--duration-s` of simulated time): 6 well-behaved tenants by true Zipf (s 1.1)
sending 0.5 requests/s in all (Poisson; the load test's 4 users at one request per 8 s), 38-token prompts
(SmolLM2's chat template around a short question), 16-token answers; 2 whales that, in the first half of
every 30 s, each send a 340-token document for a 32-token answer every 4 s (about what the gateway let
through in the measured runs: 2 in flight and 12 a minute per whale). Runs: isolated (no whales) and with
the whales, for the fix (config.yaml), the fix before the yield rule (the_fix/config_before_yield.yaml) and
the first attempt (first_attempt/config.yaml). Step times: shared_engine/sim/step_profiles/
cpu-2core_smollm2-135m.json (fixed cost plus tokens; LoRA's own cost is not in it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
CASE_DIR = HERE.parent
REPO = CASE_DIR.parent
sys.path.insert(0, str(REPO))

from case_multilora.loadtest.zipf import zipf_choice  # noqa: E402
from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.sim.calibration import for_model  # noqa: E402
from shared_engine.sim.hardware import load_hardware  # noqa: E402
from shared_engine.sim.metrics import SimMetrics  # noqa: E402
from shared_engine.sim.model_shape import resolve_arch  # noqa: E402
from shared_engine.sim.simulator import Simulator  # noqa: E402
from shared_engine.sim.workload import RequestSpec, TraceWorkload  # noqa: E402

SERVER_KEYS = ("lora_modules", "allowed_local_lora_path")
WELL_BEHAVED = [("t1", "acme"), ("t2", "json"), ("t3", "french"), ("t4", "upper"), ("t5", "acme"), ("t6", "json")]
WHALES = [("w1", "french"), ("w2", "upper")]
CONFIGS = {"the_fix": "config.yaml", "before_yield": "the_fix/config_before_yield.yaml",
           "first_attempt": "first_attempt/config.yaml"}


class TenantMetrics(SimMetrics):
    """SimMetrics plus each finished request's tenant, arrival and first-token time (seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, float, float, float]] = []

    def on_finish(self, request) -> None:
        super().on_finish(request)
        self.rows.append((request.tenant, request.arrival_time, request.first_token_time, request.finished_time))


def trace(duration_s: float, whales: bool, seed: int = 0) -> list[RequestSpec]:
    rng = random.Random(seed)
    out, t, n = [], 0.0, 0
    while True:
        t += rng.expovariate(0.5)
        if t >= duration_s:
            break
        tenant, adapter = WELL_BEHAVED[zipf_choice(rng, len(WELL_BEHAVED), 1.1)]
        out.append(RequestSpec(f"wb-{n}", t, [rng.randrange(100, 40000) for _ in range(38)], 16, adapter,
                               tenant=tenant))
        n += 1
    if whales:
        for k, (tenant, adapter) in enumerate(WHALES):
            for start in np.arange(0.0, duration_s, 30.0):
                for j, at in enumerate(np.arange(start + 0.5 * k, start + 15.0, 4.0)):
                    out.append(RequestSpec(f"{tenant}-{int(start)}-{j}", float(at),
                                           [rng.randrange(100, 40000) for _ in range(340)], 32, adapter,
                                           tenant=tenant))
    return out


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def simulate(name: str, whales: bool, duration_s: float) -> dict:
    flat = {k: v for k, v in yaml.safe_load((CASE_DIR / CONFIGS[name]).read_text()).items() if k not in SERVER_KEYS}
    model, arch = resolve_arch(flat.get("model"))
    sim = Simulator(EngineConfig.from_flat(**flat), arch, for_model(load_hardware("cpu-2core"), model, "cpu-2core"))
    metrics = TenantMetrics()
    sim.run(TraceWorkload(trace(duration_s, whales)), metrics)
    wb = [(a, f) for t, a, f, _ in metrics.rows if t.startswith("t")]
    wh = [(a, f, e) for t, a, f, e in metrics.rows if t.startswith("w")]
    ttft = [f - a for a, f in wb]
    return {"config": CONFIGS[name], "whales": whales, "num_well_behaved": len(wb), "num_whale": len(wh),
            "well_behaved_median_ttft_ms": pct(ttft, 50), "well_behaved_p99_ttft_ms": pct(ttft, 99),
            "whale_median_ttft_ms": pct([f - a for a, f, _ in wh], 50),
            "whale_median_e2e_ms": pct([e - a for a, _, e in wh], 50), "num_steps": metrics.num_steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    runs = {}
    for name in CONFIGS:
        alone, loaded = simulate(name, False, args.duration_s), simulate(name, True, args.duration_s)
        ratio = loaded["well_behaved_p99_ttft_ms"] / alone["well_behaved_p99_ttft_ms"]
        loaded["p99_ttft_vs_isolated"] = round(ratio, 2)
        runs[name] = {"isolated": alone, "with_whales": loaded}
    out = {"what": "modelled, not measured: the engine's scheduler in simulated time, CPU step profile",
           "command": "python case_multilora/loadtest/sim_isolation.py " + " ".join(argv or sys.argv[1:]),
           "step_profile": "shared_engine/sim/step_profiles/cpu-2core_smollm2-135m.json",
           "duration_s": args.duration_s, "runs": runs}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
