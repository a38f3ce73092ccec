"""A server's decode step on the CPU with and without one competing busy process, per thread setting.

Why: on a 2-core machine torch's OpenMP threads (one per core by default) meet at a barrier in every
kernel; when another process holds one core, every barrier waits for a descheduled thread, and with
libgomp's default wait policy the waiting thread spins on the core the other threads need. The engine's
`--num-threads` and the passive wait policy (`OMP_WAIT_POLICY=PASSIVE`, which `serve` now sets unless it is
set) are the remedies; this measures them.

For each setting: `python -m shared_engine serve` (the default model, engine core in its own process), one
warm-up request, then `--requests` greedy streamed completions of `--max-tokens` tokens one at a time
(batch 1: the gap between two tokens is one decode step plus the HTTP chunk), first alone, then with one
competing process (`while True: pass`). Reported: the median inter-token gap (ms) of each phase and the
slowdown. The machine may be shared (the load average before each phase is recorded).

    python scripts/bench_cpu_contention.py --out benchmarks/results/cpu_contention_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.env_info import environment  # noqa: E402

# (label, --num-threads, OMP_WAIT_POLICY): "" is libgomp's default (unset: spin, then sleep), the behaviour
# before serve set PASSIVE.
SETTINGS = [("2 threads, default wait policy (before)", 2, ""), ("2 threads, passive", 2, "PASSIVE"),
            ("1 thread, passive", 1, "PASSIVE")]
PROMPT = "Write a long story about a lighthouse keeper and the sea."


def start_server(port: int, threads: int, policy: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OMP_NUM_THREADS", None)
    cmd = [sys.executable, "-m", "shared_engine", "serve", "--port", str(port), "--max-model-len", "512",
           "--kv-cache-memory", str(256 * 1024**2), "--num-threads", str(threads), "--uvicorn-log-level", "warning"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not start")


def token_gaps(url: str, max_tokens: int) -> list[float]:
    """Seconds between consecutive streamed chunks of one greedy completion."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    stamps = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:])]


def phase(url: str, requests: int, max_tokens: int) -> dict:
    load = os.getloadavg()[0]
    gaps = [g for _ in range(requests) for g in token_gaps(url, max_tokens)]
    return {"median_itl_ms": 1e3 * statistics.median(gaps), "mean_itl_ms": 1e3 * statistics.fmean(gaps),
            "p90_itl_ms": 1e3 * statistics.quantiles(gaps, n=10)[-1], "num_gaps": len(gaps),
            "load_average_1m_before": load}


def measure(label: str, threads: int, policy: str, args, log_dir: Path) -> dict:
    port = 8700 + threads + (10 if policy else 0)
    proc = start_server(port, threads, policy, log_dir / f"server_{threads}_{policy or 'default'}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        token_gaps(url, 8)  # warm-up
        alone = phase(url, args.requests, args.max_tokens)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(1)
            contended = phase(url, args.requests, args.max_tokens)
        finally:
            busy.kill()
            busy.wait()
    finally:
        proc.terminate()
        proc.wait(30)
    row = {"setting": label, "num_threads": threads, "omp_wait_policy": policy or "(libgomp default)",
           "alone": alone, "with_one_busy_process": contended,
           "slowdown": contended["median_itl_ms"] / alone["median_itl_ms"]}
    print(f"{label:45s} alone {alone['median_itl_ms']:7.1f} ms  contended {contended['median_itl_ms']:7.1f} ms"
          f"  x{row['slowdown']:.1f}", flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="cpu_contention_"))  # server logs, if a run needs a look
    rows = [measure(label, threads, policy, args, log_dir) for label, threads, policy in SETTINGS]
    result = {"benchmark": "cpu_contention", "model": "SmolLM2-135M-Instruct (default, fp32)",
              "config": {"max_model_len": 512, "batch": 1, "max_tokens": args.max_tokens, "requests": args.requests,
                         "engine": "engine core in its own process (serve default)", "prompt": PROMPT},
              "competitor": "one `python -c 'while True: pass'` process",
              "command": "python scripts/bench_cpu_contention.py " + " ".join(argv or sys.argv[1:]),
              **environment(), "results": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
