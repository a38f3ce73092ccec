"""`SimMetrics`: what a simulated run measured, summarised with `vllm bench serve`'s names.

Per request: TTFT (first token time - arrival), E2E latency (finish - arrival), TPOT ((E2E - TTFT) / (output
tokens - 1), excluding the first token), queue time, prompt, output and cached tokens. Per token: ITL (gap
between consecutive tokens of a request, including a recompute after preemption, as a client sees it).
Per step: KV usage (time-weighted mean and max), preemptions, busy time. All times in seconds inside,
milliseconds in the summary (`median_ttft_ms`, ...), as the benchmark conventions ask.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = {"mean": None, "median": 50, "p90": 90, "p95": 95, "p99": 99}


@dataclass
class SimMetrics:
    arrival: array = field(default_factory=lambda: array("d"))
    first_token: array = field(default_factory=lambda: array("d"))
    first_scheduled: array = field(default_factory=lambda: array("d"))
    finished: array = field(default_factory=lambda: array("d"))
    num_prompt: array = field(default_factory=lambda: array("q"))
    num_output: array = field(default_factory=lambda: array("q"))
    num_cached: array = field(default_factory=lambda: array("q"))
    itl: array = field(default_factory=lambda: array("d"))
    num_steps: int = 0
    busy_s: float = 0.0
    kv_usage_time: float = 0.0  # integral of usage over busy time
    kv_usage_max: float = 0.0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # tokens looked up at admission (re-admissions after preemption too)
    prefix_cache_hits: int = 0
    # KV offload: tokens restored from the host tier (in prefix_cache_hits too), blocks copied each way,
    # and the seconds those copies added to steps
    host_prefix_cache_hits: int = 0
    num_offloaded_blocks: int = 0
    num_restored_blocks: int = 0
    host_copy_s: float = 0.0
    num_replicas: int = 1
    num_blocks: int = 0
    slo_missed: bool = False  # stopped early by a `SloWatch`: the figures cover only part of the run

    def on_step(self, seconds: float, kv_usage: float, num_preempted: int) -> None:
        self.num_steps += 1
        self.busy_s += seconds
        self.kv_usage_time += kv_usage * seconds
        if kv_usage > self.kv_usage_max:
            self.kv_usage_max = kv_usage
        self.num_preemptions += num_preempted

    def on_end(self, scheduler) -> None:
        """Take the scheduler's prefix cache counters (`vllm:prefix_cache_queries_total` / `_hits_total`)."""
        self.prefix_cache_queries += getattr(scheduler, "prefix_cache_queries", 0)
        self.prefix_cache_hits += getattr(scheduler, "prefix_cache_hits", 0)
        self.host_prefix_cache_hits += getattr(scheduler, "host_prefix_cache_hits", 0)
        bm = getattr(scheduler, "block_manager", None)
        self.num_offloaded_blocks += getattr(bm, "num_offloaded_blocks_total", 0)
        self.num_restored_blocks += getattr(bm, "num_restored_blocks_total", 0)

    def on_finish(self, request) -> None:
        self.arrival.append(request.arrival_time)
        self.first_token.append(request.first_token_time)
        self.first_scheduled.append(request.first_scheduled_time)
        self.finished.append(request.finished_time)
        self.num_prompt.append(request.num_prompt_tokens)
        self.num_output.append(request.num_output_tokens)
        self.num_cached.append(request.num_cached_tokens)

    def merge(self, other: SimMetrics) -> SimMetrics:
        """Combine replicas: requests pooled, busy time summed, utilisation over all replicas."""
        for name in ("arrival", "first_token", "first_scheduled", "finished", "num_prompt", "num_output",
                     "num_cached", "itl"):
            getattr(self, name).extend(getattr(other, name))
        self.num_steps += other.num_steps
        self.busy_s += other.busy_s
        self.kv_usage_time += other.kv_usage_time
        self.kv_usage_max = max(self.kv_usage_max, other.kv_usage_max)
        self.num_preemptions += other.num_preemptions
        self.prefix_cache_queries += other.prefix_cache_queries
        self.prefix_cache_hits += other.prefix_cache_hits
        self.host_prefix_cache_hits += other.host_prefix_cache_hits
        self.num_offloaded_blocks += other.num_offloaded_blocks
        self.num_restored_blocks += other.num_restored_blocks
        self.host_copy_s += other.host_copy_s
        self.slo_missed |= other.slo_missed
        return self

    def summary(self) -> dict:
        """A flat dict with `vllm bench serve`'s keys plus the capacity model's own."""
        n = len(self.arrival)
        arrival, first, finish = (np.frombuffer(a, dtype=float) for a in (self.arrival, self.first_token,
                                                                            self.finished))
        n_out = np.frombuffer(self.num_output, dtype=np.int64)
        n_in = np.frombuffer(self.num_prompt, dtype=np.int64)
        duration = float(finish.max() - min(arrival.min(), 0.0)) if n else 0.0
        out = {
            "completed": n, "duration_s": duration,
            "total_input_tokens": int(n_in.sum()), "total_output_tokens": int(n_out.sum()),
            "request_throughput": n / duration if duration else 0.0,
            "output_throughput": float(n_out.sum()) / duration if duration else 0.0,
            "total_token_throughput": float(n_out.sum() + n_in.sum()) / duration if duration else 0.0,
        }
        ttft = first - arrival
        e2el = finish - arrival
        multi = n_out > 1
        tpot = (e2el[multi] - ttft[multi]) / (n_out[multi] - 1)
        queue = np.frombuffer(self.first_scheduled, dtype=float) - arrival
        for label, values in (("ttft", ttft), ("tpot", tpot), ("itl", np.frombuffer(self.itl, dtype=float)),
                              ("e2el", e2el), ("queue", queue)):
            out.update(_stats(label, values))
        cached = int(np.frombuffer(self.num_cached, dtype=np.int64).sum())
        capacity = self.busy_s if self.busy_s else 1.0
        out.update({
            "num_preemptions": self.num_preemptions,
            "prefix_cache_queries": self.prefix_cache_queries, "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_hit_rate": self.prefix_cache_hits / max(1, self.prefix_cache_queries),
            "prompt_tokens_cached_share": cached / n_in.sum() if n else 0.0,
            "host_prefix_cache_hits": self.host_prefix_cache_hits, "num_offloaded_blocks": self.num_offloaded_blocks,
            "num_restored_blocks": self.num_restored_blocks, "host_copy_s": self.host_copy_s,
            "kv_cache_usage_mean": self.kv_usage_time / capacity,
            "kv_cache_usage_max": self.kv_usage_max,
            "num_steps": self.num_steps, "busy_s": self.busy_s, "num_replicas": self.num_replicas,
            "num_kv_blocks_per_replica": self.num_blocks,
            "utilisation": self.busy_s / (duration * self.num_replicas) if duration else 0.0,
        })
        return out


def _stats(label: str, values: np.ndarray) -> dict:
    out = {}
    for stat, q in PERCENTILES.items():
        if not len(values):
            value = 0.0
        elif q is None:
            value = float(values.mean())
        else:
            value = float(np.percentile(values, q))
        out[f"{stat}_{label}_ms"] = 1000.0 * value
    return out
