"""Prefix caching benchmark: the same workloads against servers with caching on and off, and with the `lru`
and `cost` eviction policies, in one run; one results JSON.

Workloads (token-id prompts on the serving benchmark's client, `scripts/bench_serving.py`):
- `shared_prefix`: its `prefix_repetition` dataset, one 4,096-token shared prefix + 128-token unique
  suffixes, 64 requests, all at once: median TTFT, throughput and hit rate, caching on vs off.
- `no_shared_prefix`: its `random` dataset: the cost of caching when nothing is shared (throughput on vs off).
- `hot_prefix_under_pressure`: one request in four shares a hot 1,024-token system prompt, the others are
  one-off 1,024-token prompts, on a KV pool a few prompts deep: `lru` vs `cost` by hit rate and TTFT.

    python scripts/bench_prefix_caching.py --out benchmarks/results/prefix_caching_cpu_smollm2.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.env_info import environment  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_serving", ROOT / "scripts" / "bench_serving.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_serving"] = bench  # its dataclasses look their module up while being created
_spec.loader.exec_module(bench)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m shared_engine serve` in a subprocess on 127.0.0.1, stopped on exit."""

    def __init__(self, flags: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "shared_engine", "serve", "--port", str(self.port),
                                      *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: serve {' '.join(flags)}")
            time.sleep(1)
        raise RuntimeError("server did not become healthy in 300 s")

    def counter(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def measure(flags: list[str], samples, rate: float, max_concurrency: int | None, seed: int) -> dict:
    with Server(flags) as server:
        model = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        args = SimpleNamespace(base_url=server.url, max_concurrency=max_concurrency, request_rate=rate,
                               burstiness=1.0, seed=seed, ignore_eos=True)
        results, duration = asyncio.run(bench.run(args, samples, model))
        m = bench.metrics(results, duration)
        queries = server.counter("vllm:prefix_cache_queries_total")
        hits = server.counter("vllm:prefix_cache_hits_total")
    keep = ("duration", "completed", "failed", "output_throughput", "total_token_throughput", "median_ttft_ms",
            "mean_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms")
    return {"server_flags": flags, **{k: m[k] for k in keep}, "prefix_cache_queries_tokens": queries,
            "prefix_cache_hits_tokens": hits, "prefix_cache_hit_rate": hits / queries if queries else 0.0}


def hot_prefix_samples(rng, vocab: int, num: int, hot_len: int, suffix_len: int, one_off_len: int, output_len: int,
                       hot_every: int):
    """Every `hot_every`-th request is the hot prefix plus a unique suffix; the others are one-off prompts."""
    hot = rng.integers(100, vocab, hot_len).tolist()
    samples = []
    for i in range(num):
        if i % hot_every == 0:
            samples.append(bench.Sample(hot + rng.integers(100, vocab, suffix_len).tolist(), output_len))
        else:
            samples.append(bench.Sample(rng.integers(100, vocab, one_off_len).tolist(), output_len))
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="served model (default: the embedded model)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--prefix-len", type=int, default=4096)
    p.add_argument("--suffix-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--hot-len", type=int, default=1024, help="hot prefix and one-off prompt length (pressure run)")
    p.add_argument("--pressure-requests", type=int, default=48)
    p.add_argument("--hot-every", type=int, default=4, help="one request in this many uses the hot prefix")
    p.add_argument("--pressure-blocks", type=int, default=300, help="KV pool (blocks of 16) for the pressure run")
    p.add_argument("--pressure-rate", type=float, default=1.0, help="requests/s in the pressure run")
    p.add_argument("--skip", nargs="*", default=[], help="workloads to skip")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    max_len = max(args.prefix_len + args.suffix_len + args.output_len, args.hot_len + 32 + args.output_len,
                  256 + 64) + 16
    base = ([args.model] if args.model else []) + ["--max-model-len", str(max_len)]
    vocab = 49152
    report = {"benchmark": "prefix_caching", **environment(), "command": " ".join(sys.argv), "workloads": {}}

    def record(name: str, result: dict) -> None:
        report["workloads"][name] = result
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(name, json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=None), flush=True)

    if "shared_prefix" not in args.skip:
        samples = bench.prefix_repetition_dataset(np.random.default_rng(args.seed), vocab, args.num_prompts,
                                                  args.prefix_len, args.suffix_len, 1, args.output_len)
        runs = {mode: measure(base + [flag], samples, float("inf"), None, args.seed)
                for mode, flag in (("on", "--enable-prefix-caching"), ("off", "--no-enable-prefix-caching"))}
        runs["median_ttft_speedup"] = runs["off"]["median_ttft_ms"] / runs["on"]["median_ttft_ms"]
        record("shared_prefix", runs)
    if "no_shared_prefix" not in args.skip:
        samples = bench.random_dataset(np.random.default_rng(args.seed), vocab, args.num_prompts, 256, 64, 0.0)
        runs = {mode: measure(base + [flag], samples, float("inf"), None, args.seed)
                for mode, flag in (("on", "--enable-prefix-caching"), ("off", "--no-enable-prefix-caching"))}
        runs["throughput_on_over_off"] = runs["on"]["output_throughput"] / runs["off"]["output_throughput"]
        record("no_shared_prefix", runs)
    if "hot_prefix_under_pressure" not in args.skip:
        samples = hot_prefix_samples(np.random.default_rng(args.seed), vocab, args.pressure_requests, args.hot_len,
                                     32, args.hot_len, args.output_len, args.hot_every)
        flags = base + ["--num-gpu-blocks-override", str(args.pressure_blocks)]
        runs = {policy: measure(flags + ["--prefix-cache-eviction", policy], samples, args.pressure_rate, 4, args.seed)
                for policy in ("lru", "cost")}
        record("hot_prefix_under_pressure", runs)


if __name__ == "__main__":
    main()
