"""Soak: the RAG case's CPU load (locust headless, 8 closed-loop users started evenly over `--ramp-s`,
workload.yaml `cpu`) against the compose
stack (rag_stack.py) for a fixed time; errors, resident memory over time and latency percentiles per window.

    python -m reliability.soak --duration-s 1800     # README "Reliability": 30 minutes

Every `--sample-s` seconds it records each container's resident memory (rag_stack.rss_mib) and the engine's
gauges. At the end: locust's failures and every error event, the memory slope (MiB per hour, least squares
over the samples after `--warmup-s`, which runs before the measured `--duration-s`) per container, and p50/p95
TTFT and ITL per window of `--window-s`.
The stack is stopped at the end (volumes kept: the next start reuses the converted model and the ingested
corpus). Bounded: locust runs warm-up + duration (-t), the whole script at most that + 20 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from reliability import rag_stack
from reliability.results import RESULTS, add_append_argument, percentile, save, slope_per_hour

LOCUSTFILE = Path(__file__).with_name("soak_locustfile.py")


def sample_memory(stop: threading.Event, every_s: float, out: list[dict]) -> None:
    pids = {s: rag_stack.container_pid(s) for s in rag_stack.SERVICES}
    start = time.time()
    while not stop.is_set():
        row = {"t": round(time.time() - start, 1)}
        for service, pid in pids.items():
            row[service] = round(rag_stack.rss_mib(pid), 1) if pid else None
        row["kv_cache_usage_perc"] = rag_stack.metric("vllm:kv_cache_usage_perc")
        row["num_requests_running"] = rag_stack.metric("vllm:num_requests_running")
        row["load_1min"] = round(os.getloadavg()[0], 2)  # the machine's other work, beside the stack's
        out.append(row)
        stop.wait(every_s)


def memory_summary(samples: list[dict], warmup_s: float) -> dict:
    """Per container: resident MiB at the start (after warm-up), end and max, and the least-squares slope
    over the whole steady part and over its second half (a one-off drop, e.g. the kernel reclaiming
    file-backed pages under memory pressure, dominates the first)."""
    steady = [s for s in samples if s["t"] >= warmup_s]
    memory = {}
    for service in rag_stack.SERVICES:
        points = [(s["t"], s[service]) for s in steady if s.get(service)]
        if points:
            half = points[len(points) // 2:]
            memory[service] = {"start_mib": points[0][1], "end_mib": points[-1][1],
                               "max_mib": max(v for _, v in points),
                               "slope_mib_per_hour": round(slope_per_hour(points) or 0.0, 2),
                               "slope_second_half_mib_per_hour": round(slope_per_hour(half) or 0.0, 2)}
    return memory


def _spread(values: list[float]) -> dict | None:
    """min / median / max of `values` (None for none)."""
    return {"min": min(values), "median": percentile(values, 0.5), "max": max(values)} if values else None


def windows(events: list[dict], t0: float, window_s: float) -> list[dict]:
    rows = []
    end = max((e["t"] for e in events), default=t0)
    k = 0
    while t0 + k * window_s < end:
        lo, hi = t0 + k * window_s, t0 + (k + 1) * window_s
        part = [e for e in events if lo <= e["t"] < hi]
        row = {"window": k, "start_s": round(lo - t0), "requests": sum(e["type"] == "POST" for e in part)}
        for kind in ("TTFT", "ITL"):
            ms = [e["ms"] for e in part if e["type"] == kind]
            row[f"p50_{kind.lower()}_ms"] = percentile(ms, 0.5)
            row[f"p95_{kind.lower()}_ms"] = percentile(ms, 0.95)
        rows.append(row)
        k += 1
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=int, default=1800)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--sample-s", type=float, default=15.0)
    p.add_argument("--warmup-s", type=float, default=600.0,
                   help="load before the measured --duration-s (not in the windows or the memory slope): the "
                        "RAG workload's finite question pool fills the prefix cache in the first ~7 minutes "
                        "(hit rate ~50% -> ~99%), TTFT 10-30x the steady state meanwhile (results entry "
                        "soak_quiet, 2026-12-02; a start ramped over 120 s, stopped after 12 minutes, the same)")
    p.add_argument("--ramp-s", type=float, default=120.0,
                   help="start the users evenly over this many seconds (locust -r users/ramp); 4 (-r 2 for 8 "
                        "users, the earlier soaks) starts them as one burst, whose queue on the 2-core CPU "
                        "(8 cold RAG prompts at ~80 prompt tok/s) took the first 5-10 minutes to drain")
    p.add_argument("--window-s", type=float, default=300.0)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/reliability-soak"))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--keep-up", action="store_true", help="leave the stack running at the end")
    add_append_argument(p, "soak")
    p.add_argument("--reanalyse-memory", action="store_true",
                   help="recompute the memory summary from WORK_DIR/samples.json into the results file; run nothing")
    args = p.parse_args(argv)
    if args.reanalyse_memory:
        data = json.loads(args.out.read_text())
        samples = json.loads((args.work_dir / "samples.json").read_text())
        data["soak"]["memory"] = memory_summary(samples, data["soak"]["config"]["warmup_s"])
        args.out.write_text(json.dumps(data, indent=2) + "\n")
        print(json.dumps(data["soak"]["memory"], indent=1))
        return 0
    args.work_dir.mkdir(parents=True, exist_ok=True)
    events_path = args.work_dir / "events.jsonl"
    events_path.unlink(missing_ok=True)

    spawn_rate = args.users / max(args.ramp_s, 1e-3)
    up_s = rag_stack.up()
    print(f"stack up in {up_s:.0f} s", flush=True)
    images = rag_stack.images()
    samples: list[dict] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_memory, args=(stop, args.sample_s, samples), daemon=True)
    t0 = time.time()
    sampler.start()
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(args.users),
           "-r", f"{spawn_rate:.4f}",
           "-t", f"{args.duration_s + args.warmup_s:.0f}s", "--stop-timeout", "60", "--host", rag_stack.url("APP_PORT"),
           "--rag-profile", "cpu", "--csv", str(args.work_dir / "locust"), "--json-file",
           str(args.work_dir / "locust"), "--only-summary"]
    with open(args.work_dir / "locust.log", "w") as log:
        locust = subprocess.run(cmd, cwd=rag_stack.REPO, env={**rag_stack.env(), "SOAK_EVENTS": str(events_path)},
                                stdout=log, stderr=subprocess.STDOUT, timeout=args.duration_s + args.warmup_s + 1200)
    stop.set()
    sampler.join(timeout=60)
    idle = {"num_requests_running": rag_stack.metric("vllm:num_requests_running"),
            "num_requests_waiting": rag_stack.metric("vllm:num_requests_waiting"),
            "kv_cache_usage_perc": rag_stack.metric("vllm:kv_cache_usage_perc")}
    engine_logs = rag_stack.compose("logs", "--no-color", "engine", timeout=120).stdout
    (args.work_dir / "engine.log").write_text(engine_logs)
    if not args.keep_up:
        rag_stack.down()

    events = [json.loads(line) for line in events_path.read_text().splitlines() if line.strip()]
    stats = json.loads((args.work_dir / "locust.json").read_text())
    requests = sum(s["num_requests"] for s in stats if s["method"] == "POST")
    failures = sum(s["num_failures"] for s in stats)
    memory = memory_summary(samples, args.warmup_s)
    per_window = windows(events, t0 + args.warmup_s, args.window_s)
    full = [w for w in per_window if w["requests"] > 0 and w["start_s"] + args.window_s <= args.duration_s]
    p95s = [w["p95_ttft_ms"] for w in full if w["p95_ttft_ms"]]
    section = {
        "config": {"stack": "case_rag_chatbot/docker-compose.yaml (engine, Chroma server, app, Prometheus)",
                   "engine_config": "case_rag_chatbot/the_fix/config_cpu.yaml", "system_prompt_tokens": 1024,
                   "answer_max_tokens": 32, "users": args.users, "think_time": "exponential, mean 15 s",
                   "duration_s": args.duration_s, "warmup_s": args.warmup_s, "window_s": args.window_s,
                   "ramp_s": args.ramp_s, "spawn_rate_users_per_s": round(spawn_rate, 4)},
        "locust_exit_code": locust.returncode,
        "requests": requests, "failures": failures,
        "error_events": sum(1 for e in events if e["error"]),
        "first_errors": [e["error"] for e in events if e["error"]][:5],
        "memory": memory, "windows": per_window,
        "p95_ttft_ms_max_over_min_window": round(max(p95s) / min(p95s), 2) if len(p95s) > 1 else None,
        "engine_after_run": idle, "stack_up_s": round(up_s, 1), "num_memory_samples": len(samples),
        "images": images,
        "load_average_1min": _spread([s["load_1min"] for s in samples if "load_1min" in s]),
    }
    save("soak", section, args.out, args.append_to)
    (args.work_dir / "samples.json").write_text(json.dumps(samples))
    print(json.dumps({k: v for k, v in section.items() if k != "windows"}, indent=1))
    return 0 if failures == 0 and locust.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
