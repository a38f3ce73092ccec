"""GPUs, GPU-hours and $ for the night on H200, H100 and L4, at the brief's 2M tickets and at 10x: modelled,
not measured (no GPU needed; `shared_engine.sim` runs the engine's own scheduler in simulated time).

    python case_batch_summarisation/cost_model.py --json case_batch_summarisation/cost_model.json

Workload: workload.yaml (every ticket queued at once, log-normal ticket lengths after the 288-token shared
instruction, 100-150-token summaries); engine: the fix (config.yaml) with llama-3.1-8b in bf16, on the whole
device. Per GPU, one replica runs `num_requests` tickets; its simulated tickets/s is the GPU's rate, since
shards are independent and a night is long (the warm-up and the last wave are a small share of 8 hours).

Step times: each GPU's datasheet peaks with the fractions and overheads fitted to llama-3.1-8b's recorded
H200 step profile (the RAG case's `hardware_for`; other GPUs assumed to reach the same shares of their peaks).
Calibration by the measured run: the H200 run of the fix (the_fix/offline_h200.json) gives the measured
tickets/s of the same workload shape; every GPU's modelled rate is multiplied by measured / modelled on the
H200 (`calibration_factor`; the raw figures stay in the JSON).

The night: GPUs = ceil(tickets / window / rate); GPU-hours = tickets / rate / 3600 (the work; a fleet held
for the whole window costs GPUs x window); $ per 1M tokens = $/hour / (tokens per hour), prompt and
summary tokens both counted; the provider's batch API at its list price (workload.yaml's dated input).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

CASE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(CASE_DIR.parent))

from case_rag_chatbot.cost_model import DEFAULT_PRICES, hardware_for  # noqa: E402
from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.sim import Simulator, WorkloadSpec  # noqa: E402
from shared_engine.sim.model_shape import resolve_arch  # noqa: E402

MODEL = "llama-3.1-8b"
GPUS = ("h200", "h100-sxm", "l4")
MEASURED = CASE_DIR / "the_fix" / "offline_h200.json"


def load_workload(path: Path = CASE_DIR / "workload.yaml") -> tuple[WorkloadSpec, dict, dict]:
    raw = yaml.safe_load(path.read_text())
    night, prices = raw.pop("night"), raw["prices"]
    return WorkloadSpec.from_dict(raw), night, prices


def engine_config(gpu: str) -> EngineConfig:
    fix = yaml.safe_load((CASE_DIR / "config.yaml").read_text())
    fix.pop("served_model_name", None)
    return EngineConfig.from_flat(model=MODEL, **fix)


def simulate(gpu: str, spec: WorkloadSpec) -> dict:
    """One replica on `gpu` over the workload's tickets: the simulator's summary (tickets/s etc.)."""
    _, arch = resolve_arch(MODEL)
    hardware = hardware_for(gpu)
    if hardware.price_usd_per_hour is None and gpu in DEFAULT_PRICES:
        import dataclasses

        usd, date, source = DEFAULT_PRICES[gpu]
        hardware = dataclasses.replace(hardware, price_usd_per_hour=usd, price_date=date, price_source=source)
    s = Simulator(engine_config(gpu), arch, hardware).run_replicas(spec, 1).summary()
    keep = ("completed", "duration_s", "request_throughput", "output_throughput", "total_token_throughput",
            "total_input_tokens", "total_output_tokens", "prefix_cache_hit_rate", "num_preemptions",
            "kv_cache_usage_max", "num_kv_blocks_per_replica", "num_steps")
    return {"gpu": hardware.name, "price_usd_per_hour": hardware.price_usd_per_hour,
            "price_source": f"{hardware.price_source} ({hardware.price_date})", **{k: s[k] for k in keep}}


def night_plan(rate: float, tokens_per_ticket: float, price: float, tickets: int, window_h: float) -> dict:
    """The fleet for `tickets` in `window_h` at `rate` tickets/s per GPU."""
    needed = tickets / (window_h * 3600)
    gpus = math.ceil(needed / rate)
    gpu_hours = tickets / rate / 3600
    return {"tickets": tickets, "window_h": window_h, "tickets_per_s_needed": needed, "gpus": gpus,
            "gpu_hours_of_work": gpu_hours, "hours_on_that_fleet": gpu_hours / gpus,
            "cost_usd_gpu_hours": gpu_hours * price, "cost_usd_fleet_for_window": gpus * window_h * price,
            "usd_per_million_tokens": price / (rate * tokens_per_ticket * 3600 / 1e6)}


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(CASE_DIR.parent))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=None, help="tickets per simulated replica")
    p.add_argument("--gpus", default=",".join(GPUS))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--measured", type=Path, default=MEASURED, help="the H200 results file that calibrates")
    args = p.parse_args(argv)
    spec, night, prices = load_workload()
    if args.num_requests:
        import dataclasses

        spec = dataclasses.replace(spec, num_requests=args.num_requests)
    measured = json.loads(args.measured.read_text())["run"]
    raw = {gpu: simulate(gpu, spec) for gpu in args.gpus.split(",")}
    factor = measured["rows_per_s"] / raw["h200"]["request_throughput"] if "h200" in raw else 1.0
    per_ticket_tokens = (measured["prompt_tokens"] + measured["completion_tokens"]) / measured["num_rows"]
    in_share = measured["prompt_tokens"] / (measured["prompt_tokens"] + measured["completion_tokens"])
    api_per_1m = in_share * prices["api_input_usd_per_1m"] + (1 - in_share) * prices["api_output_usd_per_1m"]
    result = {"model": MODEL, "workload": "case_batch_summarisation/workload.yaml", "modelled": True,
              "calibration": {"measured_file": _relative(args.measured),
                              "measured_h200_tickets_per_s": measured["rows_per_s"],
                              "modelled_h200_tickets_per_s": raw.get("h200", {}).get("request_throughput"),
                              "calibration_factor": factor},
              "tokens_per_ticket": per_ticket_tokens, "prompt_share_of_tokens": in_share,
              "api_batch_usd_per_million_tokens": api_per_1m, "api_prices": prices, "gpus": {}}
    print(f"calibration: measured H200 {measured['rows_per_s']:.1f} tickets/s / modelled "
          f"{raw.get('h200', {}).get('request_throughput', float('nan')):.1f} = x{factor:.3f}")
    print(f"provider batch API (blended at this prompt share): ${api_per_1m:.3f} per 1M tokens")
    for gpu, sim in raw.items():
        rate = sim["request_throughput"] * factor
        price = sim["price_usd_per_hour"]
        entry = {"simulated": sim, "tickets_per_s": rate,
                 "prompt_tokens_per_s": rate * per_ticket_tokens * in_share,
                 "output_tokens_per_s": rate * per_ticket_tokens * (1 - in_share)}
        for label, mult in (("1x", 1), ("10x", 10)):
            plan = night_plan(rate, per_ticket_tokens, price, night["tickets"] * mult, night["window_h"])
            plan["usd_per_million_tokens_vs_api"] = plan["usd_per_million_tokens"] / api_per_1m
            entry[label] = plan
        result["gpus"][gpu] = entry
        a, b = entry["1x"], entry["10x"]
        print(f"{sim['gpu']:>10}: {rate:6.1f} tickets/s; 2M/8h: {a['gpus']} GPUs, {a['gpu_hours_of_work']:.1f} "
              f"GPU-h, ${a['cost_usd_gpu_hours']:.0f} ({a['usd_per_million_tokens']:.4f} $/1M tok, "
              f"{a['usd_per_million_tokens_vs_api']:.2f}x the batch API); 10x: {b['gpus']} GPUs")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
