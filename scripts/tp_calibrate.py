"""Calibrate the capacity model's tensor-parallel term (shared_engine/sim/tp_comm.py) from a step profile
recorded at TP = N (scripts/profile_steps.py --tensor-parallel-size N, on N GPUs; needs GPU spans).

Each recorded step's device span minus the step-time model's device time for it without collectives (the
busiest rank's roofline share plus the profile's device overheads, as calibrated on the TP=1 step profile
of the same model) is that step's collective time; `tp_comm.fit` solves latency and bus bandwidth by least
squares. Prints and writes the fit, with its residuals; put the two figures into
shared_engine/sim/hardware_profiles/<gpu>.json (`allreduce_latency_s`, `allreduce_bandwidth`) with the
results file as `allreduce_source`.

    python scripts/tp_calibrate.py --profile OUT/steps_tp2_llama8b.json --gpu h200 --out OUT/tp_calibration.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from shared_engine.model_arch import ModelArch
    from shared_engine.sim.calibration import for_model
    from shared_engine.sim.hardware import load_hardware
    from shared_engine.sim.step_time import StepTimeModel, item_totals
    from shared_engine.sim.tp_comm import fit

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, required=True, help="step profile recorded at TP = N")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    data = json.loads(args.profile.read_text())
    tp = data["engine_config"]["tensor_parallel_size"]
    if tp < 2 or not any(s["gpu_seconds"] for s in data["steps"]):
        raise SystemExit("the profile must be recorded at tensor_parallel_size >= 2 on GPUs (device spans)")
    arch = ModelArch.from_dict(data["model_config"])
    hardware = load_hardware(args.gpu)
    hardware = for_model(hardware, data["model"])  # fractions and device overheads fitted at TP=1, if recorded
    hardware = dataclasses.replace(hardware, allreduce_latency_s=0.0, allreduce_bandwidth=float("inf"),
                                   step_overhead_s=0.0, per_seq_overhead_s=0.0)  # device time only, no comm
    model = StepTimeModel(arch, data["dtype"], hardware, tensor_parallel_size=tp)
    points = []
    for step in data["steps"]:
        totals = item_totals(step["items"])
        comm = step["gpu_seconds"] - model.seconds_from_totals(*totals)
        points.append((totals[1], totals[2], comm))
    latency, bandwidth = fit(model.comm, points)
    fitted = dataclasses.replace(model.comm, latency_s=latency, bus_bandwidth=bandwidth)
    residuals = [abs(fitted.seconds(n, s) - c) for n, s, c in points]
    result = {"what": "tensor-parallel collective time fitted from a step profile (scripts/tp_calibrate.py)",
              "command": "python " + " ".join(sys.argv), "profile": str(args.profile), "gpu": args.gpu,
              "tensor_parallel_size": tp, "model": data["model"], "num_steps": len(points),
              "allreduce_latency_s": latency, "allreduce_bandwidth": bandwidth,
              "median_abs_residual_s": statistics.median(residuals), "max_abs_residual_s": max(residuals)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
