"""The batch case's scheduler on the CPU (no model): host time per step against the waiting queue, and the
20,000-ticket night's completion rate in simulated time, longest prompt first (run_batch's order) or not.

    # host ms per step, the waiting queue held at each size (a finished request is replaced by a new one):
    python scripts/bench_scheduler_queue.py hold --label after --out benchmarks/results/scheduler_queue_scaling_cpu.json
    python scripts/bench_scheduler_queue.py hold --max-num-partial-prefills 4 --label after_caps --out ...
    # the night in simulated time (shared_engine.sim's H200 step model), both orders, against the H200 run:
    python scripts/bench_scheduler_queue.py drain --out benchmarks/results/scheduler_queue_scaling_cpu.json
    # the offline engine's whole host loop (LLMEngine.step, async scheduling, detokenisation, stats) on the default
    # model with the model runner faked, waiting held at 500 and 6,000 in turn:
    python scripts/bench_scheduler_queue.py engine --out benchmarks/results/scheduler_queue_scaling_cpu.json

The engine config is the case's (the_fix/config.yaml: max_num_seqs 1024, max_num_batched_tokens 16384, prefix
caching, async scheduling) on llama-3.1-8b's H200 KV pool as `shared_engine.sim` sizes it. Tickets: the brief's
log-normal (median 600 tokens, sigma 0.7, cut to [60, 6000]) + 20 template tokens after a 288-token shared
instruction, 100-150 output tokens, token ids random (prefix hits are the instruction's); the instruction is
computed first, as run_batch does. Steps run in the engine's async-scheduling order (schedule n+1, resolve n,
apply n+1) with one dummy token per sampling row. `hold` times schedule + resolve + apply_launched per step
(perf_counter and thread CPU time, cyclic GC off as in the simulator; the shared 2-core machine's load moves
the wall figures by 2x, so the JSON keeps the load average and the prefix lookups per step, which do not
depend on it) over `--steps` steps after `--warm`; `drain` adds the step model's seconds per step
(`overlap_host`: the device's time, async scheduling) and records tickets finished per minute of simulated
time (the last minute is partial). `--label` keys the entry in `--out` (other entries are kept).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
PREFIX_LEN, TEMPLATE_TOKENS = 288, 20
# tickets finished at each elapsed second of the H200 run at c518670 (its 60 s progress lines; 537 s: SIGTERM)
H200_C518670 = {60: 284, 120: 1191, 180: 2413, 240: 3873, 300: 5638, 360: 7689, 420: 10213, 480: 13118, 537: 16498}


def build(max_num_partial_prefills: int | None = None):
    from case_rag_chatbot.cost_model import hardware_for
    from shared_engine.config import EngineConfig
    from shared_engine.sim import Simulator
    from shared_engine.sim.model_shape import resolve_arch

    fix = yaml.safe_load((ROOT / "case_batch_summarisation" / "the_fix" / "config.yaml").read_text())
    fix.pop("served_model_name", None)
    if max_num_partial_prefills:
        fix["max_num_partial_prefills"] = max_num_partial_prefills
    config = EngineConfig.from_flat(model="llama-3.1-8b", **fix)
    _, arch = resolve_arch("llama-3.1-8b")
    return Simulator(config, arch, hardware_for("h200"), overlap_host=True)


class Tickets:
    """Seeded tickets as scheduler requests (module docstring)."""

    def __init__(self, seed: int = 0) -> None:
        from shared_engine.sampling_params import SamplingParams

        self.rng = np.random.default_rng(seed)
        self.prefix = self.rng.integers(10, 49000, PREFIX_LEN).tolist()
        self.params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
        self.count = 0

    def prefix_request(self):
        from shared_engine.core.request import Request

        return Request("prefix", self.prefix + [5], self.params, max_tokens=1)

    def lengths(self, n: int) -> np.ndarray:
        return np.clip(self.rng.lognormal(math.log(600), 0.7, n), 60, 6000).astype(int) + TEMPLATE_TOKENS

    def request(self, length: int, max_tokens: int):
        from shared_engine.core.request import Request

        self.count += 1
        ids = self.prefix + self.rng.integers(10, 49000, int(length)).tolist()
        return Request(f"t{self.count}", ids, self.params, max_tokens=int(max_tokens))

    def new(self):
        return self.request(self.lengths(1)[0], self.rng.integers(100, 151))


def step(sched, prev, now: float):
    """One engine step's scheduler work in the async-scheduling order; (out, requests resolved)."""
    out = sched.schedule(now)
    updated = []
    if prev is not None:
        updated = sched.resolve(prev, {s.request_id: (0,) for s in prev.scheduled if s.needs_sample}, now)
    if not out.is_empty:
        sched.apply_launched(out, now)
    return out, updated


def hold(args) -> dict:
    sim = build(args.max_num_partial_prefills)
    result = {"num_kv_blocks": sim.num_blocks, "warm_steps": args.warm, "timed_steps": args.steps, "sizes": {}}
    for n in args.sizes:
        sched, tickets = sim.new_scheduler(), Tickets()
        sched.add_request(tickets.prefix_request())
        for _ in range(n + sim.config.scheduler.max_num_seqs):
            sched.add_request(tickets.new())
        calls = [0]
        lookup = sched.block_manager.find_cached_prefix

        def counted(request, lookup=lookup, calls=calls):
            calls[0] += 1
            return lookup(request)

        sched.block_manager.find_cached_prefix = counted
        gc.collect()
        gc.disable()
        prev, ms, cpu_ms, waiting, running, lookups = None, [], [], [], [], []
        for i in range(args.warm + args.steps):
            calls[0] = 0
            t0, c0 = time.perf_counter(), time.thread_time()
            out, updated = step(sched, prev, 0.0)
            t1, c1 = time.perf_counter(), time.thread_time()
            prev = None if out.is_empty else out
            for r in updated:
                if r.is_finished:
                    sched.add_request(tickets.new())
            if i >= args.warm:
                ms.append(1e3 * (t1 - t0))
                cpu_ms.append(1e3 * (c1 - c0))
                waiting.append(sched.num_waiting)
                running.append(sched.num_running)
                lookups.append(calls[0])
        gc.enable()
        entry = {"waiting_min": min(waiting), "waiting_max": max(waiting), "running_mean": float(np.mean(running)),
                 "host_ms_per_step_median": float(np.median(ms)), "host_ms_per_step_mean": float(np.mean(ms)),
                 "host_ms_per_step_p10": float(np.percentile(ms, 10)),
                 "cpu_ms_per_step_median": float(np.median(cpu_ms)), "load_average_1min": os.getloadavg()[0],
                 "prefix_lookups_per_step_mean": float(np.mean(lookups))}
        result["sizes"][str(n)] = entry
        print(f"waiting {n}: host {entry['host_ms_per_step_median']:.2f} ms/step median "
              f"({entry['host_ms_per_step_mean']:.2f} mean, thread CPU {entry['cpu_ms_per_step_median']:.2f}), "
              f"running {entry['running_mean']:.0f}, "
              f"{entry['prefix_lookups_per_step_mean']:.1f} prefix lookups/step", flush=True)
    return result


def drain(args) -> dict:
    sim = build()
    seconds = sim.step_model.seconds_from_totals
    result = {"num_tickets": args.num_tickets, "num_kv_blocks": sim.num_blocks, "orders": {}}
    for order in ("longest_first", "arrival"):
        sched, tickets = sim.new_scheduler(), Tickets()
        lengths = tickets.lengths(args.num_tickets)
        outputs = tickets.rng.integers(100, 151, args.num_tickets)
        index = np.argsort(-lengths, kind="stable") if order == "longest_first" else np.arange(args.num_tickets)
        sched.add_request(tickets.prefix_request())
        for i in index:
            sched.add_request(tickets.request(lengths[i], outputs[i]))
        gc.disable()
        prev, now, done, marks = None, 0.0, -1, []  # -1: the prefix request is not a ticket
        host = {"steps": 0, "ms": 0.0}
        while sched.has_unfinished_requests() or prev is not None:
            t0 = time.perf_counter()
            out, updated = step(sched, prev, now)
            host["ms"] += 1e3 * (time.perf_counter() - t0)
            host["steps"] += 1
            done += sum(1 for r in updated if r.is_finished)
            if not out.is_empty:
                starts = pairs = sampled = 0
                for s in out.scheduled:
                    k, p = len(s.token_ids), s.start_position
                    starts += p
                    pairs += k * p + (k * (k + 1) >> 1)
                    sampled += s.needs_sample
                now += seconds(len(out.scheduled), out.num_batched_tokens, sampled, starts + out.num_batched_tokens,
                               pairs)
            marks.append((now, done))
            prev = None if out.is_empty else out
        gc.enable()
        times = [t for t, _ in marks]

        def finished_by(t: float, times=times, marks=marks) -> int:
            i = int(np.searchsorted(times, t, side="right")) - 1
            return marks[i][1] if i >= 0 else 0

        minutes = [finished_by(60.0 * (m + 1)) - finished_by(60.0 * m) for m in range(int(now // 60) + 1)]
        entry = {"simulated_s": now, "tickets_per_s": args.num_tickets / now,
                 "tickets_per_s_each_minute": [c / 60.0 for c in minutes],  # the last minute is partial
                 "preemptions": sched.num_preemptions_total, "steps": host["steps"],
                 "host_ms_per_step_mean_this_cpu": host["ms"] / host["steps"]}
        if order == "longest_first":
            entry["h200_c518670_finished_over_simulated"] = {
                str(t): {"measured": m, "simulated": finished_by(t), "ratio": m / max(finished_by(t), 1)}
                for t, m in H200_C518670.items() if t <= now}  # past the simulated end the ratio says nothing
        result["orders"][order] = entry
        print(f"{order}: {now:.1f} simulated s, {entry['tickets_per_s']:.1f} tickets/s, per minute "
              f"{[round(r) for r in entry['tickets_per_s_each_minute']]}, preemptions {entry['preemptions']}",
              flush=True)
    return result


def engine(args) -> dict:
    """Host ms per `LLMEngine.step()` with the runner's launch/collect replaced by a fake that samples token
    1234 for every sampling row (so everything but the model runs: scheduler, output builder, detokeniser,
    stats); tickets of ~60 tokens after a 64-token prefix, 10-15 output tokens, `final_only` as run_batch."""
    from shared_engine import LLM
    from shared_engine.model_executor.model_runner import StepResult
    from shared_engine.sampling.sampler import SampleResult
    from shared_engine.sampling_params import SamplingParams

    llm = LLM(None, max_num_seqs=256, max_num_batched_tokens=4096, enable_prefix_caching=True, async_scheduling=True)
    eng = llm.engine

    class Launched:
        def __init__(self, rows):
            self.rows = rows

    eng.runner.launch = lambda out, previous=None: Launched([s.request_id for s in out.scheduled if s.needs_sample])
    eng.runner.collect = lambda step: StepResult({rid: [SampleResult(1234)] for rid in step.rows}, {})
    eng.runner.release = lambda rid: None
    rng = np.random.default_rng(0)
    prefix = rng.integers(100, 40000, 64).tolist()
    count = [0]

    def add():
        count[0] += 1
        ids = prefix + rng.integers(100, 40000, int(np.clip(rng.lognormal(math.log(60), 0.7), 10, 600))).tolist()
        eng.add_request(f"batch-{count[0]}", ids, SamplingParams(temperature=0.0, max_tokens=int(rng.integers(10, 16)),
                                                                ignore_eos=True), final_only=True)

    runs = []
    gc.disable()
    for n in args.engine_sizes:
        while eng.scheduler.num_waiting > n + 300:
            eng.step()
        while eng.scheduler.num_waiting < n:
            add()
        ms = []
        for i in range(args.warm // 4 + args.steps // 2):
            t0 = time.perf_counter()
            outs = eng.step()
            t1 = time.perf_counter()
            for o in outs:
                if o.finished:
                    add()
            if i >= args.warm // 4:
                ms.append(1e3 * (t1 - t0))
        runs.append({"waiting_held_at": n, "waiting_end": eng.scheduler.num_waiting,
                     "running_end": eng.scheduler.num_running, "host_ms_per_engine_step_median": float(np.median(ms)),
                     "load_average_1min": os.getloadavg()[0]})
        print(f"engine, waiting ~{n}: {runs[-1]['host_ms_per_engine_step_median']:.2f} ms per step (median), "
              f"running {eng.scheduler.num_running}", flush=True)
    gc.enable()
    return {"runs": runs, "max_num_seqs": 256, "max_num_batched_tokens": 4096}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("hold", "drain", "engine"))
    p.add_argument("--sizes", type=int, nargs="+", default=[20000, 10000, 1000], help="hold: waiting queue sizes")
    p.add_argument("--warm", type=int, default=150, help="hold: steps before timing (the running set fills)")
    p.add_argument("--steps", type=int, default=300, help="hold: steps timed")
    p.add_argument("--max-num-partial-prefills", type=int, default=None, help="hold: a partial-prefill cap")
    p.add_argument("--num-tickets", type=int, default=20000, help="drain: tickets queued at once")
    p.add_argument("--engine-sizes", type=int, nargs="+", default=[500, 6000, 500, 6000],
                   help="engine: waiting queue sizes, in turn")
    p.add_argument("--label", default=None, help="the entry's key in --out (default: the mode)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    from benchmarks.env_info import environment

    result = {"hold": hold, "drain": drain, "engine": engine}[args.mode](args)
    result.update(command="python " + " ".join(sys.argv), environment=environment())
    if args.out:
        data = json.loads(args.out.read_text()) if args.out.exists() else {}
        data[args.label or args.mode] = result
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
