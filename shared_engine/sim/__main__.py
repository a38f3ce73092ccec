"""`python -m shared_engine.sim --config ENGINE.yaml --workload WORKLOAD.yaml [--gpu H200 --replicas N]`

Simulates the workload on N replicas of the engine (the engine's real scheduler and block manager, the
step-time roofline for the GPU), then the same workload at 10x traffic, and, when the workload names an
SLO, the fewest replicas meeting it at both loads. Prints a text table; `--json` and `--png` write files.
The engine YAML is the server's (flat names: `max_num_seqs`, `max_num_batched_tokens`, `model`, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from shared_engine.config import EngineConfig
from shared_engine.sim.calibration import for_model
from shared_engine.sim.cost import cost_summary, fewest_replicas
from shared_engine.sim.hardware import hardware_key, hardware_names, load_hardware
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.report import to_text, write_json, write_png
from shared_engine.sim.simulator import Simulator
from shared_engine.sim.workload_spec import WorkloadSpec


def load_engine_yaml(path: str | None) -> dict:
    if path is None:
        return {}
    import yaml

    raw = yaml.safe_load(Path(path).read_text()) or {}
    return {k.replace("-", "_"): v for k, v in raw.items()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m shared_engine.sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="engine YAML (the server's flat settings); default: engine defaults")
    p.add_argument("--workload", required=True, help="workload YAML (see shared_engine/sim/examples)")
    p.add_argument("--gpu", default="H200", help=f"hardware profile: {', '.join(hardware_names())}")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--model", help="preset or config.json path; overrides the YAML's `model`")
    p.add_argument("--price-per-hour", type=float, help="GPU $/hour, overriding the profile's dated price")
    p.add_argument("--traffic-multiplier", type=float, default=10.0, help="the scaled scenario (0: skip)")
    p.add_argument("--max-replicas", type=int, default=256, help="upper bound of the SLO search")
    p.add_argument("--search-requests", type=int, default=2000,
                   help="requests per SLO-search probe (the first this many of the workload; 0: all)")
    p.add_argument("--num-requests", type=int, help="override the workload's request count")
    p.add_argument("--jobs", type=int, default=2,
                   help="processes simulating replicas in parallel (1: everything in this process)")
    p.add_argument("--json", help="write the full report here")
    p.add_argument("--png", help="write a latency plot here (needs matplotlib: pip install '.[sim]')")
    return p


def run_scenario(sim: Simulator, workload: WorkloadSpec, replicas: int, price, args, map_fn=map) -> dict:
    """The workload on `replicas` replicas, plus the SLO search (probes on the first `search_requests`).
    `map_fn` runs each run's replicas (`Simulator.run_replicas`)."""
    summary = sim.run_replicas(workload, replicas, map_fn).summary()
    section = {"workload": workload.name, "summary": summary,
               "cost": cost_summary(summary, price, replicas * sim.tensor_parallel_size, workload.prices)}
    if workload.slo:
        probe = workload
        if args.search_requests and workload.num_requests and workload.num_requests > args.search_requests:
            probe = dataclasses.replace(workload, num_requests=args.search_requests)
        def simulate(n: int) -> dict | None:  # None: stopped once the SLO was certainly missed
            metrics = sim.run_replicas(probe, n, map_fn, stop_on_slo_miss=workload.slo)
            return None if metrics.slo_missed else metrics.summary()

        found = fewest_replicas(simulate, workload.slo, args.max_replicas, start=replicas)
        section["fewest_replicas_for_slo"] = {
            "slo": workload.slo, "replicas": found and found[0], "probe_requests": probe.num_requests,
            "summary": found and found[1],
            "cost": found and cost_summary(found[1], price, found[0] * sim.tensor_parallel_size, workload.prices),
        }
    return section


def run_scenarios(sim: Simulator, scenarios: dict, replicas: int, price, args) -> dict:
    """With `--jobs` > 1, every replica simulation (of each scenario's run and SLO-search probes) is a task
    for one pool of `--jobs` processes (the scheduler is Python: one core each). Each scenario's own steps
    (the run, then the search) go on in a thread here, so a scenario with a longer search gets the cores
    the other has finished with. The report is the same as with `--jobs 1`."""
    if args.jobs <= 1:
        return {name: run_scenario(sim, w, replicas, price, args) for name, w in scenarios.items()}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        pool.submit(int).result()  # fork the workers now, before this process starts threads
        with ThreadPoolExecutor(len(scenarios)) as threads:
            futures = {name: threads.submit(run_scenario, sim, w, replicas, price, args, pool.map)
                       for name, w in scenarios.items()}
            return {name: future.result() for name, future in futures.items()}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    flat = load_engine_yaml(args.config)
    if args.model:
        flat["model"] = args.model
    model_name, arch = resolve_arch(flat.get("model"))
    config = EngineConfig.from_flat(**flat)
    # The device's recorded step profile for this model, when there is one (on the H200: llama-3.1-8b, qwen3-0.6b).
    hardware = for_model(load_hardware(args.gpu), model_name, hardware_key(args.gpu))
    if args.price_per_hour is not None:
        hardware = hardware.with_price(args.price_per_hour)
    workload = WorkloadSpec.from_yaml(args.workload)
    if args.num_requests is not None:
        workload = dataclasses.replace(workload, num_requests=args.num_requests)
    sim = Simulator(config, arch, hardware)
    price = hardware.price_usd_per_hour
    report = {"inputs": {"model": model_name, "dtype": sim.dtype, "hardware": dataclasses.asdict(hardware),
                         "engine_config": sim.config.to_flat(), "workload": _plain(workload),
                         "replicas": args.replicas, "num_kv_blocks_per_replica": sim.num_blocks},
              "note": "modelled with the engine's scheduler in simulated time, not measured"}
    scenarios = {"baseline": workload}
    if args.traffic_multiplier:
        scenarios["traffic_10x"] = dataclasses.replace(workload.scaled(args.traffic_multiplier),
                                                       name=f"{workload.name} x{args.traffic_multiplier:g}")
    report.update(run_scenarios(sim, scenarios, args.replicas, price, args))
    if args.traffic_multiplier:
        report["traffic_10x"]["multiplier"] = args.traffic_multiplier
    report["wall_s"] = time.perf_counter() - started
    print(to_text(report), end="")
    if args.json:
        write_json(report, args.json)
    if args.png and not write_png(report, args.png):
        print("matplotlib is not installed: no PNG written (pip install '.[sim]')", file=sys.stderr)
    return 0


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


if __name__ == "__main__":
    sys.exit(main())
