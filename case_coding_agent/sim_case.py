"""The case on the H200, modelled: the h200 trace through the simulator (`shared_engine/sim`: the engine's own
scheduler and block manager, step times from the H200 llama-3.1-8b step profile), first attempt vs the fix,
two replicas, routed as each variant's router does (`sim_trace.route`). Every figure is modelled, not
measured.

    python -m case_coding_agent.sim_case --variant first_attempt   # first_attempt/sim_h200.json
    python -m case_coding_agent.sim_case --variant the_fix         # the_fix/sim_h200.json
    python -m case_coding_agent.sim_case --variant the_fix --sessions 8,16,24,32 --out the_fix/sim_sweep_h200.json

`--sessions` regenerates the trace with that many warm sessions (make_trace's generator, the h200 profile
otherwise unchanged) and runs one replica's share; the cost model reads that sweep. `--acceptance-rate` sets
the modelled speculation's per-token acceptance (the simulator has no proposer: draws at that rate, and it
speculates on every step, without the engine's `auto` policy).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import yaml

from case_coding_agent.loadtest.make_trace import TRACES, commit, default_tokenizer
from case_coding_agent.loadtest.session_gen import CASE_DIR, WORKLOAD_FILE, SessionGenerator, load_profile
from case_coding_agent.loadtest.summary import summarize
from case_coding_agent.loadtest.trace import TraceRecord, read_trace, sessions
from case_coding_agent.sim_trace import SessionTraceWorkload, route
from shared_engine.config import EngineConfig
from shared_engine.sim.calibration import for_model
from shared_engine.sim.hardware import hardware_key, load_hardware
from shared_engine.sim.metrics import SimMetrics
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.simulator import Simulator


@dataclasses.dataclass
class TurnMetrics(SimMetrics):
    request_ids: list = dataclasses.field(default_factory=list)

    def on_finish(self, request) -> None:
        super().on_finish(request)
        self.request_ids.append(request.request_id)


def build_simulator(variant: str, gpu: str, acceptance_rate: float | None, overrides: dict) -> Simulator:
    workload = yaml.safe_load(WORKLOAD_FILE.read_text())
    flat = {**yaml.safe_load((CASE_DIR / workload["variants"][variant]["config"]["h200"]).read_text()),
            **workload["engine"]["h200"], **overrides}
    flat.pop("load_format", None)
    model_name, arch = resolve_arch(flat.get("model"))
    config = EngineConfig.from_flat(**flat)
    spec = config.speculative_config
    if spec is not None and acceptance_rate is not None:
        config = dataclasses.replace(config, speculative=dataclasses.replace(
            config.speculative, speculative_config=dataclasses.replace(spec, acceptance_rate=acceptance_rate)))
    hardware = for_model(load_hardware(gpu), model_name, hardware_key(gpu))
    return Simulator(config, arch, hardware)


def turns_of(metrics: TurnMetrics, records: dict[str, TraceRecord], last_turn: dict[str, int]) -> list[dict]:
    rows = []
    for k, request_id in enumerate(metrics.request_ids):
        r = records[request_id]
        kind = "cold" if r.session_id.startswith("cold") and r.turn == 1 else (
            "edit" if r.turn == last_turn[r.session_id] and r.turn > 1 else "read")
        first, end, out = metrics.first_token[k], metrics.finished[k], metrics.num_output[k]
        rows.append({"request_id": request_id, "session_id": r.session_id, "turn": r.turn, "kind": kind,
                     "start_s": metrics.arrival[k], "first_token_s": first, "ttft_s": first - metrics.arrival[k],
                     "end_s": end, "prompt_tokens": metrics.num_prompt[k], "cached_tokens": metrics.num_cached[k],
                     "output_tokens": out, "tpot_s": (end - first) / (out - 1) if out > 1 else None,
                     "chunk_times_s": [], "replica": None, "error": None})
    return rows


def simulate(sim: Simulator, records: list[TraceRecord], block_tokens: int, policy: str, replicas: int,
             only_replica: int | None = None) -> dict:
    last_turn = {s: t[-1].turn for s, t in sessions(records).items()}
    by_id = {r.request_id: r for r in records}
    rows, itl, busy, preempt, steps = [], [], 0.0, 0, 0
    for i, part in enumerate(route(records, policy, replicas)):
        if only_replica is not None and i != only_replica:
            continue
        metrics = TurnMetrics(num_blocks=sim.num_blocks)
        sim.run(SessionTraceWorkload(part, block_tokens, sim.arch.vocab_size, sim.max_model_len), metrics)
        replica_rows = turns_of(metrics, by_id, last_turn)
        for row in replica_rows:
            row["replica"] = f"replica-{i}"
        rows += replica_rows
        itl += list(metrics.itl)
        busy, preempt, steps = busy + metrics.busy_s, preempt + metrics.num_preemptions, steps + metrics.num_steps
    summary = summarize(rows, block_tokens)  # the ceiling at the trace's granularity: what synthetic ids can share
    import numpy as np

    summary |= {"all_median_itl_ms": round(float(np.median(itl)) * 1000, 2) if itl else None,
                "all_p99_itl_ms": round(float(np.percentile(itl, 99)) * 1000, 2) if itl else None,
                "num_preemptions": preempt, "num_steps": steps, "busy_s": round(busy, 1),
                "makespan_s": round(max(r["end_s"] for r in rows), 1),
                "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
                "recomputed_prompt_tokens": sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows),
                "output_tokens": sum(r["output_tokens"] for r in rows)}
    summary["output_throughput"] = round(summary["output_tokens"] / summary["makespan_s"], 1)
    return {"summary": summary, "turns": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", required=True, choices=["first_attempt", "the_fix"])
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--sessions", help="comma-separated warm-session counts: a sweep on one replica")
    ap.add_argument("--acceptance-rate", type=float, help="modelled speculation acceptance (default: config's)")
    ap.add_argument("--set", action="append", default=[], help="engine setting override KEY=VALUE (YAML value)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    started = time.perf_counter()
    sim = build_simulator(args.variant, args.gpu, args.acceptance_rate, overrides)
    policy = yaml.safe_load(WORKLOAD_FILE.read_text())["variants"][args.variant]["routing"]
    trace = TRACES / "h200" / "trace.jsonl"
    header, records = read_trace(trace)
    report = {"note": "modelled with the engine's scheduler in simulated time (shared_engine/sim), not measured",
              "case": "coding_agent", "variant": args.variant, "gpu": args.gpu, "routing": policy,
              "command": "python -m case_coding_agent.sim_case " + " ".join(sys.argv[1:] or argv or []),
              "commit": commit(), "engine_config": sim.config.to_flat(), "num_kv_blocks_per_replica": sim.num_blocks,
              "hardware": dataclasses.asdict(sim.hardware), "trace": str(trace.relative_to(CASE_DIR)),
              "trace_header": header}
    if args.sessions:
        tokenizer, runs = default_tokenizer(), []
        for n in (int(x) for x in args.sessions.split(",")):
            profile = dataclasses.replace(load_profile("h200"), sessions=n)
            _, recs, _ = SessionGenerator(profile, tokenizer).generate()
            # one replica holding every session: the sweep asks how many sessions one GPU serves
            result = simulate(sim, recs, header["block_tokens"], "session_hash", 1)
            runs.append({"sessions": n, "summary": result["summary"]})
            print(n, json.dumps({k: v for k, v in result["summary"].items() if k != "replicas_per_session"}))
        report["sweep"] = runs
    else:
        result = simulate(sim, records, header["block_tokens"], policy, args.replicas)
        report |= {"replicas": args.replicas, **result}
        print(json.dumps({k: v for k, v in result["summary"].items() if k != "replicas_per_session"}, indent=1))
    report["wall_s"] = round(time.perf_counter() - started, 1)
    out = args.out or CASE_DIR / args.variant / "sim_h200.json"
    out = out if out.is_absolute() else CASE_DIR / out
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
